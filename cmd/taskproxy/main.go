// Command taskproxy runs a stateless Taskstore proxy.
//
// Start-up, in order: parse flags, set up logging, listen on --listen (gRPC)
// and --http, connect to the --cluster nodes and read the routing table in
// the background (until then /readyz and gRPC health say not ready, and
// requests wait for the table within their deadline), then wait for
// SIGINT/SIGTERM and stop gracefully: health NOT_SERVING, no new
// connections, requests in flight finished within --shutdown-timeout.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/cmd/internal/buildinfo"
	"github.com/e1158ecb/taskstore/cmd/internal/gcpercent"
	"github.com/e1158ecb/taskstore/cmd/internal/logging"
	"github.com/e1158ecb/taskstore/cmd/internal/secflags"
	"github.com/e1158ecb/taskstore/internal/tracing"
	"github.com/e1158ecb/taskstore/proxy"
)

type flags struct {
	listen, cluster, http string
	retryBudget           time.Duration
	streamIdle            time.Duration // --stream-idle
	answerMemoryMiB       int
	logLevel, logFormat   string
	shutdownTimeout       time.Duration
	sec                   secflags.Server
	pprof, allowAnonymous bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := rootCmd(ctx, os.Stderr)
	err := cmd.Execute()
	stop()
	if err != nil {
		os.Exit(1)
	}
}

// rootCmd is taskproxy; it runs until ctx ends (main cancels it on SIGINT or
// SIGTERM). Logs go to logw.
func rootCmd(ctx context.Context, logw io.Writer) *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "taskproxy --cluster NODE_ADDR,... [--listen ADDR] [--http ADDR]",
		Short: "Run a stateless Taskstore proxy",
		Long: `taskproxy serves the same gRPC TaskStore and Admin services as a node and
forwards each request to the leader of the shard that owns it, so callers
need no routing of their own: point any gRPC client, taskctl --proxy, or
client.Dial(..., client.WithProxyOnly()) at it.

It learns the cluster from any of the --cluster nodes (the others are found
in the routing table), follows leader changes as the nodes report them, and
retries only what is safe: requests the cluster did not apply, and Modify or
Claim requests under a request id, which make a retry return the first
answer. Errors come back as the node gave them (codes and details).

A proxy keeps no state. Run as many as you like behind a load balancer;
stopping one loses nothing. It holds its callers' answers in memory until
they are sent: --answer-memory bounds them all at once, and a large answer
beyond it is refused with RESOURCE_EXHAUSTED (the caller retries later or
reads fewer tasks per call) rather than growing the proxy without bound.

--http serves:
  /v1/...    the API as JSON over HTTP (docs/http.md), e.g. POST /v1/modify
  /metrics   Prometheus metrics (taskstore_proxy_*)
  /healthz   200 while the process runs
  /readyz    200 once the routing table was read

gRPC health (grpc.health.v1) and reflection are served on --listen.

Security (docs/security.md): --tls-cert/--tls-key/--tls-ca serve TLS and
identify the proxy to the nodes (give it a certificate of role proxy);
--auth-tokens and --tls-client-auth check callers here, as the nodes do,
and pass each caller's identity on to the nodes, over gRPC and HTTP/JSON
alike (with TLS, --http is HTTPS; send a token as "Authorization: Bearer
TOKEN" or present a client certificate).`,
		Example: `  # in front of a three-node cluster
  taskproxy --listen 127.0.0.1:7000 --http 127.0.0.1:7300 \
    --cluster 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103

  # then, through the proxy
  taskctl --proxy --endpoints 127.0.0.1:7000 task insert demo/work --value hello
  curl -s -XPOST 127.0.0.1:7300/v1/claim -d '{"queues":["demo/work"],"claimant":"curl"}'`,
		Version:      buildinfo.Version,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.cluster == "" {
				return fmt.Errorf("--cluster is required: give the gRPC address of at least one node")
			}
			log, err := logging.New(logw, f.logLevel, f.logFormat)
			if err != nil {
				return err
			}
			return run(ctx, log, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:7000", "gRPC address to serve TaskStore, Admin, health and reflection on")
	fl.StringVar(&f.cluster, "cluster", "", "gRPC addresses of cluster nodes, comma-separated; one that answers is enough (required)")
	fl.StringVar(&f.http, "http", "127.0.0.1:7300", "HTTP address for the JSON API, /metrics, /healthz and /readyz; empty disables")
	fl.BoolVar(&f.pprof, "pprof", false, "serve /debug/pprof on --http (profiles show memory contents: keep --http private)")
	fl.BoolVar(&f.allowAnonymous, "allow-anonymous", false, "with --tls-cert but neither --auth-tokens nor --tls-client-auth: serve callers that present no credential, with this proxy's rights on the cluster (refused without this flag)")
	fl.DurationVar(&f.retryBudget, "retry-budget", proxy.DefaultRetryBudget, "how long to retry a request whose caller set no deadline (a claim's wait comes on top)")
	fl.IntVar(&f.answerMemoryMiB, "answer-memory", int(proxy.DefaultAnswerMemory>>20), "MiB of answers held at once across all callers, from receipt until sent; a large answer beyond it is refused with RESOURCE_EXHAUSTED (at least 64, the largest single answer, so that every answer can be served)")
	fl.DurationVar(&f.streamIdle, "stream-idle", client.DefaultStreamIdle, "close a Produce stream to a node once nothing was in flight on it this long (the next request opens a new one), so that streams to nodes that stopped leading, or of callers that went quiet, do not stay open; 0 keeps them open")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long requests in flight may take to finish on stop")
	f.sec.Register(fl, false)
	return cmd
}

// checkAnonymous refuses a proxy that reaches the cluster with its own
// certificate (tlsOn: the nodes see role proxy) while checking nobody that
// calls it (!policyOn): every caller would act with the proxy's rights.
// allow (--allow-anonymous) makes it a loud warning instead.
func checkAnonymous(tlsOn, policyOn, allow bool, log *slog.Logger) error {
	if !tlsOn || policyOn {
		return nil
	}
	if !allow {
		return errors.New("this proxy reaches the cluster with its certificate (--tls-cert) but checks none of its callers: anyone who reaches --listen would insert, claim and read tasks with the proxy's rights. Add --auth-tokens FILE or --tls-client-auth (docs/security.md), or --allow-anonymous if anonymous access is what you want")
	}
	log.Warn("--allow-anonymous: this proxy serves callers without a credential, with its own rights on the cluster; anyone who reaches its gRPC and HTTP ports may insert, claim and read every queue")
	return nil
}

// run serves until ctx ends, then stops gracefully.
func run(ctx context.Context, log *slog.Logger, f flags) error {
	gcPercent, gcFromEnv := gcpercent.Set()
	log.Info("garbage collector", "gc_percent", gcPercent, "from_GOGC", gcFromEnv)
	if least := taskstorepb.MaxResponseBytes >> 20; f.answerMemoryMiB < least {
		return fmt.Errorf("--answer-memory %d: must be at least %d (MiB): the largest answer a node sends must fit, or it could never be served", f.answerMemoryMiB, least)
	}
	sec, err := f.sec.Load(log, false)
	if err != nil {
		return err
	}
	if err := checkAnonymous(f.sec.TLS.Enabled(), sec.Policy.Enabled(), f.allowAnonymous, log); err != nil {
		return err
	}
	shutdownTracing, err := tracing.Setup(ctx, "taskproxy") // off unless OTEL_* asks
	if err != nil {
		return err
	}
	defer tracing.Flush(log, shutdownTracing)
	copts := []client.Option{client.WithStreamIdle(f.streamIdle)}
	if f.sec.TLS.Enabled() {
		// The same certificate (role proxy) identifies the proxy to the nodes.
		tc, err := f.sec.TLS.ClientConfig()
		if err != nil {
			return err
		}
		copts = append(copts, client.WithTLS(tc))
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	srv, err := proxy.Start(sctx, proxy.Config{Version: buildinfo.Version,
		Cluster: f.cluster, ListenAddr: f.listen, HTTPAddr: f.http, Pprof: f.pprof,
		RetryBudget: f.retryBudget, Logger: log, AnswerMemory: int64(f.answerMemoryMiB) << 20,
		TLS: sec.ServerTLS, Policy: sec.Policy, ClientOptions: copts,
		GRPCOptions: f.sec.Limits().ServerOptions(),
	})
	cancel()
	if err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("signal received, stopping")
	dctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	return srv.Shutdown(dctx)
}
