// Command taskctl is the Taskstore command line: cluster status and
// administration, and task and queue operations. It is a thin layer over the
// client package: every command dials the cluster, makes one client call and
// prints the response as a table or as protobuf JSON.
//
// docs/taskctl.md is the manual; its command reference is generated from
// this command tree (make docs).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/cmd/internal/secflags"
)

// defaultEndpoint is used when neither --endpoints nor TASKSTORE_ENDPOINTS is
// given: the first node of `taskstored dev`.
const defaultEndpoint = "127.0.0.1:7101"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// app holds what every command shares: the global flags and the output.
type app struct {
	ctx            context.Context
	stdout, stderr io.Writer
	getenv         func(string) string

	endpoints string
	output    string
	timeout   time.Duration
	proxy     bool
	sec       secflags.Client
}

// execute runs taskctl with args and returns the exit code.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{ctx: ctx, stdout: stdout, stderr: stderr, getenv: getenv}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		printError(stderr, err)
		return 1
	}
	return 0
}

func (a *app) rootCmd() *cobra.Command {
	endpoints := a.getenv("TASKSTORE_ENDPOINTS")
	if endpoints == "" {
		endpoints = defaultEndpoint
	}
	root := &cobra.Command{
		Use:   "taskctl",
		Short: "Inspect and operate a Taskstore cluster",
		Long: `taskctl talks to a Taskstore cluster over gRPC: cluster status and leadership,
and task and queue operations.

It reads the routing table from any of the --endpoints and sends each request
to the leader of the shard that owns it, retrying on leader changes until
--timeout. With --proxy the endpoints are taskproxy instances and receive
every request as it is.`,
		Example: `  taskctl status
  TASKSTORE_ENDPOINTS=10.0.0.1:7101,10.0.0.2:7101 taskctl queue list
  taskctl -o json task list crawl/fetch | jq '.tasks[].id'`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if a.output != "table" && a.output != "json" {
				return fmt.Errorf("-o %q: want table or json", a.output)
			}
			if a.timeout <= 0 {
				return fmt.Errorf("--timeout %v: must be positive", a.timeout)
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.endpoints, "endpoints", endpoints, "comma-separated node (or proxy) gRPC addresses (env TASKSTORE_ENDPOINTS)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json (protobuf JSON of the response)")
	pf.DurationVar(&a.timeout, "timeout", 10*time.Second, "give up after this long (a claim's --wait is added)")
	pf.BoolVar(&a.proxy, "proxy", false, "the endpoints are proxies: send every request to them without routing")
	a.sec.Register(pf)
	for flag, env := range map[string]string{"tls-ca": "TASKSTORE_TLS_CA", "tls-cert": "TASKSTORE_TLS_CERT", "tls-key": "TASKSTORE_TLS_KEY", "token-file": "TASKSTORE_TOKEN_FILE"} {
		if v := a.getenv(env); v != "" {
			pf.Set(flag, v)
			pf.Lookup(flag).DefValue = v
		}
		pf.Lookup(flag).Usage += " (env " + env + ")"
	}
	root.AddCommand(a.statusCmd(), a.nodeCmd(), a.shardCmd(), a.slotCmd(), a.queueCmd(), a.scheduleCmd(), a.taskCmd(), a.backupCmd(), a.certCmd())
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command group (queue, shard, ...)
// fail on a subcommand it does not have: cobra refuses one only at the
// root, and below it printed the group's help and exited 0, so a typo in a
// script went unnoticed. The group alone still prints its help.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if !cmd.HasParent() || !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	cmd.SuggestionsMinimumDistance = 2
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())
	}
}

// withClient dials the cluster and runs fn with a context bounded by
// --timeout plus extra.
func (a *app) withClient(extra time.Duration, fn func(ctx context.Context, c *client.Client) error) error {
	ctx, cancel := context.WithTimeout(a.ctx, a.timeout+extra)
	defer cancel()
	opts, err := a.sec.Options()
	if err != nil {
		return err
	}
	if a.proxy {
		opts = append(opts, client.WithProxyOnly())
	}
	c, err := client.Dial(ctx, a.endpoints, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	err = fn(ctx, c)
	if errors.Is(err, client.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded) && a.sec.TLS.Enabled() {
		// The client retried until the deadline; ask the endpoints
		// whether they refuse these credentials (see probeTLS).
		if cfg, cerr := a.sec.TLS.ClientConfig(); cerr == nil {
			if addr, perr := probeTLS(a.ctx, a.endpoints, cfg, 2*time.Second); perr != nil {
				return &tlsRefusedError{addr: addr, cause: perr, call: err}
			}
		}
	}
	return err
}

// printError writes err to w; a refused transaction gets one line per
// offending reference.
func printError(w io.Writer, err error) {
	var dep *client.DependencyError
	if errors.As(err, &dep) && len(dep.Errors) > 0 {
		fmt.Fprintf(w, "error: transaction refused (%d offending reference(s)):\n", len(dep.Errors))
		for _, r := range dep.Errors {
			fmt.Fprintf(w, "  - %s\n", client.DescribeRefError(r))
		}
		return
	}
	msg := err.Error()
	if errors.Is(err, client.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded) && client.ConnectedButSlow(err) {
		msg += "\n(the nodes were reached but did not answer in time: they are busy, or waiting on their peers; raise --timeout)"
	} else if errors.Is(err, client.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded) {
		msg += "\n(the cluster did not answer in time: check --endpoints, or raise --timeout)"
		if strings.Contains(msg, "certificate") || strings.Contains(msg, "handshake") || strings.Contains(msg, "tls:") {
			msg += "\n(a TLS problem: check --tls-ca names the cluster's CA and the nodes' certificates cover the addresses dialled)"
		}
	}
	if strings.Contains(msg, "certificate required") {
		msg += "\n(the cluster requires a client certificate: give --tls-cert and --tls-key, from `taskctl cert issue client NAME`; see docs/security.md)"
	}
	if errors.Is(err, client.ErrAmbiguous) {
		msg += "\n(give --queue QUEUE)"
	}
	if errors.Is(err, client.ErrPermission) {
		msg += "\n(give a certificate of the right role with --tls-cert/--tls-key, or a token with --token-file; see docs/security.md)"
	}
	fmt.Fprintf(w, "error: %s\n", strings.TrimSpace(msg))
}
