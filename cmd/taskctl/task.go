package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

func (a *app) taskCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Insert, claim, list, read, delete and release tasks",
		Long: `task groups the commands that work on tasks. A task is addressed by its id
and version: every change, claims included, makes a new version, and a
command naming an old version is refused.`,
		Example: `  taskctl task insert crawl/fetch --value https://example.com
  taskctl task claim crawl/fetch --wait 10s
  taskctl task delete 3f2a... --version 2`,
	}
	cmd.AddCommand(a.taskInsertCmd(), a.taskClaimCmd(), a.taskListCmd(), a.taskGetCmd(), a.taskDeleteCmd(), a.taskReleaseCmd(), a.taskChangeCmd())
	return cmd
}

// printTaskList prints tasks as a table, or as {"tasks":[...]}.
func (a *app) printTaskList(tasks []*taskstorepb.Task, next string) error {
	if a.output == "json" {
		return printJSON(a.stdout, &taskstorepb.TasksResponse{Tasks: tasks, NextPageToken: next})
	}
	return printTasks(a.stdout, tasks)
}

func (a *app) taskInsertCmd() *cobra.Command {
	var (
		value, file, key, id string
		priority             int32
		delay                time.Duration
		ifAbsent, held       bool
		claimant             string
		dedupWindow          time.Duration
		headers              []string
	)
	cmd := &cobra.Command{
		Use:   "insert QUEUE [--value V | --file F]",
		Short: "Insert a task into a queue",
		Long: `task insert adds one task to QUEUE and prints it with its id and version.

The value is --value's text or the bytes of --file ("-" reads standard input);
without either it is empty. --delay makes the task available that long after
the shard leader's clock. --id chooses the id, which makes a retried insert
safe: the cluster refuses a second task with the same id. --key must be
unique within the queue; with --if-absent an insert whose key exists returns
the existing task instead of failing. --hold, with --delay, inserts the task
held by --claimant until its time, as if claimed: nobody else may change or
delete it before then (task delete --claimant, or a change as that claimant,
still can); then it is available to every worker. --hold needs --claimant,
the producer's own name, which later commands give to revise or delete the
task (no default: a name made up here could not be given again).
--dedup-window, with --key, keeps the key reserved in the queue for that long
after the task is deleted (committed) or purged: inserting the key again
within it fails, or with --if-absent returns the task as it was deleted, so a
producer retrying after the work is done does not create it again.
--header KEY=VALUE (repeatable) sets a header: string pairs kept with the
task (trace context, tags), shown by task get and filterable in task list
(at most 32 pairs and 4 KiB).

With -o json it prints {"tasks":[TASK]}.`,
		Example: `  taskctl task insert crawl/fetch --value https://example.com
  taskctl task insert crawl/fetch --file job.json --priority 10 --delay 5m
  echo -n payload | taskctl task insert mr/map --file - --key shard-7 --if-absent
  taskctl task insert mail/send --value draft-42 --delay 10m --hold --claimant editor-1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var data []byte
			switch {
			case cmd.Flags().Changed("file"):
				var err error
				if file == "-" {
					data, err = io.ReadAll(cmd.InOrStdin())
				} else {
					data, err = os.ReadFile(file)
				}
				if err != nil {
					return err
				}
			default:
				data = []byte(value)
			}
			if delay < 0 {
				return fmt.Errorf("--delay %v: must not be negative", delay)
			}
			opts := []client.InsertOption{client.WithPriority(priority)}
			if id != "" {
				opts = append(opts, client.WithID(id))
			}
			if key != "" {
				opts = append(opts, client.WithKey(key))
			}
			if cmd.Flags().Changed("delay") {
				opts = append(opts, client.WithDelay(delay))
			}
			if ifAbsent {
				if key == "" {
					return fmt.Errorf("--if-absent needs --key")
				}
				opts = append(opts, client.IfAbsent())
			}
			if dedupWindow != 0 {
				if key == "" || dedupWindow < 0 {
					return fmt.Errorf("--dedup-window needs --key and a positive duration")
				}
				opts = append(opts, client.WithDedupWindow(dedupWindow))
			}
			if len(headers) > 0 {
				h, err := parseHeaders(headers)
				if err != nil {
					return err
				}
				opts = append(opts, client.WithHeaders(h))
			}
			if held {
				if delay <= 0 {
					return fmt.Errorf("--hold needs --delay: a task is held until its time")
				}
				if claimant == "" {
					return fmt.Errorf("--hold needs --claimant: the producer that holds the task until its time")
				}
				opts = append(opts, client.Held())
			}
			in := &taskstorepb.TaskInsert{Queue: args[0], Value: data}
			for _, o := range opts {
				o(in)
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: claimant, Inserts: []*taskstorepb.TaskInsert{in}})
				var dep *client.DependencyError
				if errors.As(err, &dep) {
					for _, r := range dep.Duplicates() {
						if r.Category == taskstorepb.RefError_INSERT_DUPLICATE_KEY && r.ExistingId != "" && (r.ExistingDeleted || deletedHolder(ctx, c, args[0], r.ExistingId)) {
							// printError words the refusal itself from its references.
							fmt.Fprintln(a.stderr, keyReservedHint(key, r.ExistingId))
							return err
						}
					}
				}
				if err != nil {
					return err
				}
				if len(resp.Inserted) != 1 {
					return fmt.Errorf("insert: the cluster returned %d tasks for one insert", len(resp.Inserted))
				}
				if len(resp.Coalesced) > 0 {
					// --if-absent found the key taken: say so, or the holder
					// reads as a new task.
					if holder := resp.Inserted[0]; slices.Contains(resp.CoalescedDeleted, 0) || deletedHolder(ctx, c, args[0], holder.Id) {
						fmt.Fprintf(a.stderr, "key %q is taken in %s: nothing inserted; this is the task that held it, as it was deleted (%s)\n",
							key, args[0], keyReservedHint(key, holder.Id))
					} else {
						fmt.Fprintf(a.stderr, "key %q is taken in %s: nothing inserted; this is the task that holds it\n", key, args[0])
					}
				}
				return a.printTaskList(resp.Inserted, "")
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&value, "value", "", "the task's value, as text")
	f.StringVar(&file, "file", "", `read the value from this file ("-": standard input)`)
	cmd.MarkFlagsMutuallyExclusive("value", "file")
	f.Int32Var(&priority, "priority", 0, "priority; higher is claimed first")
	f.StringVar(&key, "key", "", "key, unique within the queue")
	f.DurationVar(&delay, "delay", 0, "make the task available this long from now")
	f.StringVar(&id, "id", "", "the task's id (default: chosen by the cluster)")
	f.BoolVar(&ifAbsent, "if-absent", false, "with --key: return the task holding the key instead of failing")
	f.BoolVar(&held, "hold", false, "with --delay and --claimant: hold the task as --claimant until its time")
	f.StringVar(&claimant, "claimant", "", "with --hold (required there): the producer that holds the task")
	f.DurationVar(&dedupWindow, "dedup-window", 0, "with --key: keep the key reserved this long after the task is deleted")
	f.StringArrayVar(&headers, "header", nil, "set a header KEY=VALUE (repeatable)")
	return cmd
}

// parseHeaders turns KEY=VALUE flags into a header map.
func parseHeaders(flags []string) (map[string]string, error) {
	h := make(map[string]string, len(flags))
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("--header %q: want KEY=VALUE, both non-empty", f)
		}
		if _, dup := h[k]; dup {
			return nil, fmt.Errorf("--header %q: header %q is given twice", f, k)
		}
		h[k] = v
	}
	return h, nil
}

// deletedHolder reports whether the task id that a refused key names is
// gone from queue: deleted within its key's dedup window, which keeps the
// key reserved. A server that says so itself (RefError.existing_deleted,
// ModifyResponse.coalesced_deleted) spares the lookup; an older one does not.
func deletedHolder(ctx context.Context, c *client.Client, queue, id string) bool {
	_, err := c.GetIn(ctx, queue, id)
	return errors.Is(err, client.ErrNotFound)
}

func keyReservedHint(key, id string) string {
	return fmt.Sprintf("the key's task %s was deleted; key %q stays reserved until the dedup window it was inserted with (--dedup-window) ends", id, key)
}

func defaultClaimant() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("taskctl-%s-%d", host, os.Getpid())
}

func (a *app) taskClaimCmd() *cobra.Command {
	var (
		lease, wait time.Duration
		limit       uint32
		claimant    string
	)
	cmd := &cobra.Command{
		Use:   "claim QUEUE...",
		Short: "Claim available tasks under a lease",
		Long: `task claim takes up to --limit available tasks from the queues, best first
(highest priority, then oldest), and holds them for --lease as --claimant.
Each claimed task gets a new version and its "at" becomes the end of the
lease; the task must be deleted, changed or released with that version before
the lease ends, or it becomes claimable again.

Queues of several consistency groups are tried group by group. With --wait
the command blocks up to that long for a task to become available (the wait
is added to --timeout). When nothing was claimed it prints nothing, says so
on standard error and exits 0.

With -o json it prints the ClaimResponse: {"tasks":[...]}.`,
		Example: `  taskctl task claim crawl/fetch
  taskctl task claim crawl/fetch crawl/retry --limit 10 --lease 5m
  taskctl task claim mr/map --wait 30s --claimant worker-7`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if lease <= 0 || wait < 0 {
				return fmt.Errorf("--lease must be positive and --wait not negative")
			}
			req := &taskstorepb.ClaimRequest{Claimant: claimant, Queues: args, Lease: durationpb.New(lease), Limit: limit}
			if wait > 0 {
				req.Wait = durationpb.New(wait)
			}
			return a.withClient(wait, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Claim(ctx, req)
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, resp)
				}
				if len(resp.Tasks) == 0 {
					fmt.Fprintln(a.stderr, "no task available"+emptyClaimHint(ctx, c, args))
					return nil
				}
				return printTasks(a.stdout, resp.Tasks)
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&lease, "lease", 30*time.Second, "how long the claim holds")
	f.DurationVar(&wait, "wait", 0, "block up to this long for a task (0: return at once)")
	f.Uint32Var(&limit, "limit", 1, "claim at most this many tasks")
	f.StringVar(&claimant, "claimant", defaultClaimant(), "who claims")
	return cmd
}

func (a *app) taskListCmd() *cobra.Command {
	var (
		limit     uint32
		pageToken string
		filter    filterFlags
	)
	cmd := &cobra.Command{
		Use:   "list QUEUE",
		Short: "List the tasks of a queue",
		Long: `task list prints the tasks of QUEUE in claim order (highest priority, then
oldest "at", then id), claimed ones included, at most --limit of them. Values
are shown as text when they are valid UTF-8, cut to 40 characters; use task
get or -o json for the whole value. When more tasks follow, the token for the
next page is printed on standard error (pass it to --page-token).

Filters find tasks: --state (available, claimed or delayed, at the leader's
clock), --claimant, --key-prefix, --min-attempt and --err (text the task's err
contains); every one given must match. A filtered page looks at no more than
10,000 tasks, so it may be short, even empty, while more may follow: follow
the page token until none is printed. Tokens name a position in claim order,
so paging stays valid while the queue changes.

With -o json it prints the TasksResponse: {"tasks":[...],"nextPageToken":...}.`,
		Example: `  taskctl task list crawl/fetch
  taskctl task list crawl/fetch --limit 500
  taskctl task list crawl/dead --min-attempt 3 --err timeout
  taskctl task list crawl/fetch --state claimed --claimant worker-7
  taskctl -o json task list crawl/fetch | jq -r '.tasks[].value | @base64d'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := filter.request(true)
			if err != nil {
				return err
			}
			req.Queue, req.Limit, req.PageToken = args[0], limit, pageToken
			filtered := filter.set()
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Tasks(ctx, req)
				if err != nil {
					return err
				}
				if err := a.printTaskList(resp.Tasks, resp.NextPageToken); err != nil {
					return err
				}
				switch {
				case resp.NextPageToken == "" || a.output == "json":
				case filtered:
					fmt.Fprintf(a.stderr, "more tasks may match further on: --page-token %s\n", resp.NextPageToken)
				default:
					fmt.Fprintf(a.stderr, "more tasks follow: --page-token %s\n", resp.NextPageToken)
				}
				return nil
			})
		},
	}
	filter.add(cmd, "available, claimed or delayed")
	cmd.Flags().Uint32Var(&limit, "limit", 100, "list at most this many tasks (the cluster caps it at 1000)")
	cmd.Flags().StringVar(&pageToken, "page-token", "", "continue a listing where the previous page ended")
	return cmd
}

// filterFlags are the filters of task list and queue move.
type filterFlags struct {
	state   string
	headers []string
	req     taskstorepb.TasksRequest
}

func (f *filterFlags) add(cmd *cobra.Command, states string) {
	fl := cmd.Flags()
	fl.StringVar(&f.state, "state", "", "only tasks in this state: "+states)
	fl.StringVar(&f.req.Claimant, "claimant", "", "only tasks whose claimant is this (the holder, or the last one if its lease ran out)")
	fl.StringVar(&f.req.KeyPrefix, "key-prefix", "", "only tasks with a key starting with this")
	fl.Uint32Var(&f.req.MinAttempt, "min-attempt", 0, "only tasks whose attempt is at least this")
	fl.StringVar(&f.req.ErrContains, "err", "", "only tasks whose err contains this text")
	fl.StringArrayVar(&f.headers, "header", nil, "only tasks with this header KEY=VALUE (repeatable: all must match)")
}

// set reports whether any filter was given.
func (f *filterFlags) set() bool {
	return f.state != "" || f.req.Claimant != "" || f.req.KeyPrefix != "" || f.req.MinAttempt > 0 || f.req.ErrContains != "" || len(f.headers) > 0
}

// request returns a TasksRequest carrying the filters (claimed: whether
// --state claimed is allowed).
func (f *filterFlags) request(claimed bool) (*taskstorepb.TasksRequest, error) {
	req := &taskstorepb.TasksRequest{Claimant: f.req.Claimant, KeyPrefix: f.req.KeyPrefix, MinAttempt: f.req.MinAttempt, ErrContains: f.req.ErrContains}
	if len(f.headers) > 0 {
		h, err := parseHeaders(f.headers)
		if err != nil {
			return nil, err
		}
		req.Headers = h
	}
	switch f.state {
	case "":
	case "available":
		req.State = taskstorepb.TaskState_TASK_STATE_AVAILABLE
	case "delayed":
		req.State = taskstorepb.TaskState_TASK_STATE_DELAYED
	case "claimed":
		if claimed {
			req.State = taskstorepb.TaskState_TASK_STATE_CLAIMED
			break
		}
		fallthrough
	default:
		if claimed {
			return nil, fmt.Errorf("--state %q: want available, claimed or delayed", f.state)
		}
		return nil, fmt.Errorf("--state %q: want available or delayed (claimed tasks are never moved)", f.state)
	}
	return req, nil
}

func (a *app) taskGetCmd() *cobra.Command {
	var queue string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show one task with its whole value",
		Long: `task get looks the task up by id on every shard and prints all its fields,
the value in full (as escaped text when valid UTF-8, else as hex).

An id is unique within a consistency group, not across the cluster: when
tasks of several groups have it, task get prints each of them (and says so
on stderr). --queue looks in that queue only.

With -o json it prints {"tasks":[TASK...]}. A missing task is an error.`,
		Example: `  taskctl task get 3f2a9c0e
  taskctl task get job-17 --queue crawl/fetch
  taskctl -o json task get 3f2a9c0e | jq -r '.tasks[0].version'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				var tasks []*taskstorepb.Task
				if queue != "" {
					task, err := c.GetIn(ctx, queue, args[0])
					if err != nil {
						return err
					}
					tasks = append(tasks, task)
				} else {
					found, err := c.Find(ctx, args[0])
					if err != nil {
						return err
					}
					if len(found) == 0 {
						return fmt.Errorf("task %q: %w", args[0], client.ErrNotFound)
					}
					tasks = found
				}
				if len(tasks) > 1 {
					var queues []string
					for _, t := range tasks {
						queues = append(queues, t.Queue)
					}
					fmt.Fprintf(a.stderr, "note: %d tasks have id %q, in different consistency groups (queues %s): give --queue to act on one\n",
						len(tasks), args[0], strings.Join(queues, ", "))
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.TasksResponse{Tasks: tasks})
				}
				for i, task := range tasks {
					if i > 0 {
						fmt.Fprintln(a.stdout)
					}
					if err := printTask(a.stdout, task); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&queue, "queue", "", "look in this queue only")
	return cmd
}

// refFlags are the flags of commands that name one task version.
type refFlags struct {
	version  uint64
	queue    string
	claimant string
}

func (r *refFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Uint64Var(&r.version, "version", 0, "the task's current version (required)")
	cmd.MarkFlagRequired("version")
	f.StringVar(&r.queue, "queue", "", "the task's queue (default: looked up)")
	f.StringVar(&r.claimant, "claimant", "", "act as this claimant (default: the task's current claimant)")
}

// resolve fills the queue and claimant from the task itself when the flags
// do not give them. Acting as the current claimant is what lets an operator
// delete or release a task a worker holds; the version check still makes
// sure only the named version is touched.
func (r *refFlags) resolve(ctx context.Context, c *client.Client, cmd *cobra.Command, id string) ([]client.RefOption, error) {
	opts, _, err := r.resolveClaimant(ctx, c, cmd, id)
	return opts, err
}

// resolveClaimant is resolve that also returns the claimant acted as.
func (r *refFlags) resolveClaimant(ctx context.Context, c *client.Client, cmd *cobra.Command, id string) ([]client.RefOption, string, error) {
	queue, claimant, err := r.lookup(ctx, c, cmd, id)
	if err != nil {
		return nil, "", err
	}
	return []client.RefOption{client.InQueue(queue), client.AsClaimant(claimant)}, claimant, nil
}

// lookup is the task's queue and the claimant to act as: the flags', else
// the task's own.
func (r *refFlags) lookup(ctx context.Context, c *client.Client, cmd *cobra.Command, id string) (string, string, error) {
	queue, claimant := r.queue, r.claimant
	if queue == "" || !cmd.Flags().Changed("claimant") {
		// By id alone, a task of another group with the same id must not
		// be the one acted on: Get refuses an ambiguous id.
		get := func() (*taskstorepb.Task, error) { return c.Get(ctx, id) }
		if queue != "" {
			get = func() (*taskstorepb.Task, error) { return c.GetIn(ctx, queue, id) }
		}
		task, err := get()
		if err != nil {
			return "", "", err
		}
		if queue == "" {
			queue = task.Queue
		}
		if !cmd.Flags().Changed("claimant") {
			claimant = task.Claimant
		}
	}
	return queue, claimant, nil
}

func (a *app) taskDeleteCmd() *cobra.Command {
	var (
		ref        refFlags
		claimNext  []string
		claimLease time.Duration
		claimLimit uint32
	)
	cmd := &cobra.Command{
		Use:   "delete ID --version V [--claim-next QUEUE]...",
		Short: "Delete one version of a task",
		Long: `task delete deletes the task ID if its current version is V; otherwise
nothing changes and the error says what the current version is.

The task is looked up first to find its queue (skipped with --queue) and its
claimant: by default the command acts as the task's current claimant, so a
task a worker holds can be deleted; that worker's version then no longer
exists. Give --claimant to act as someone else. Ids are unique within a
consistency group only: when tasks of several groups have ID, the command
deletes nothing and lists them; give --queue to name the one meant.

--claim-next QUEUE (repeatable; queues of the task's consistency group) also
claims up to --limit tasks of those queues, in the same request and log entry,
for the same claimant (the task's, --claimant, or when neither, the default
claimant): a shell worker's commit and next claim in one call. The claim does
not wait; nothing is claimed when the delete is refused. The claimed tasks are
printed as by task claim ("no task available" on standard error when none).

With -o json it prints the ModifyResponse ({}, or {"claimed":[...]}).`,
		Example: `  taskctl task delete 3f2a9c0e --version 4
  taskctl task delete 3f2a9c0e --version 4 --queue crawl/fetch
  taskctl task delete 3f2a9c0e --version 4 --claim-next crawl/fetch --lease 5m`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if len(claimNext) > 0 && claimLease <= 0 {
				return fmt.Errorf("--lease must be positive")
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				opts, claimant, err := ref.resolveClaimant(ctx, c, cmd, id)
				if err != nil {
					return err
				}
				if len(claimNext) == 0 {
					if err := c.Delete(ctx, id, ref.version, opts...); err != nil {
						return err
					}
					if a.output == "json" {
						return printJSON(a.stdout, &taskstorepb.ModifyResponse{})
					}
					fmt.Fprintf(a.stdout, "deleted %s version %s\n", id, strconv.FormatUint(ref.version, 10))
					return nil
				}
				if claimant == "" {
					// An unclaimed task: anyone may delete it, but the
					// claim needs a name.
					opts = append(opts, client.AsClaimant(defaultClaimant()))
				}
				claimed, err := c.DeleteAndClaim(ctx, id, ref.version, client.ClaimNext(claimLease, claimLimit, claimNext...), opts...)
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.ModifyResponse{Claimed: claimed})
				}
				fmt.Fprintf(a.stderr, "deleted %s version %s\n", id, strconv.FormatUint(ref.version, 10))
				if len(claimed) == 0 {
					fmt.Fprintln(a.stderr, "no task available")
					return nil
				}
				return printTasks(a.stdout, claimed)
			})
		},
	}
	ref.add(cmd)
	f := cmd.Flags()
	f.StringArrayVar(&claimNext, "claim-next", nil, "also claim from this queue in the same request (repeatable)")
	f.DurationVar(&claimLease, "lease", 30*time.Second, "with --claim-next: how long the claim holds")
	f.Uint32Var(&claimLimit, "limit", 1, "with --claim-next: claim at most this many tasks")
	return cmd
}

func (a *app) taskReleaseCmd() *cobra.Command {
	var ref refFlags
	cmd := &cobra.Command{
		Use:   "release ID --version V",
		Short: "End a task's claim and make it available now",
		Long: `task release ends the claim on version V of task ID and makes the task
available at once, as a new version with no claimant. "Now" is the shard
leader's clock: the change sets a zero delay rather than a time read here.

As with delete, the task is looked up for its queue and the command acts as
its current claimant unless --queue and --claimant are given.

With -o json it prints {"tasks":[TASK]} with the new version.`,
		Example: `  taskctl task release 3f2a9c0e --version 5`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				opts, err := ref.resolve(ctx, c, cmd, id)
				if err != nil {
					return err
				}
				task, err := c.Release(ctx, id, ref.version, opts...)
				if err != nil {
					return err
				}
				return a.printTaskList([]*taskstorepb.Task{task}, "")
			})
		},
	}
	ref.add(cmd)
	return cmd
}

func (a *app) taskChangeCmd() *cobra.Command {
	var (
		ref       refFlags
		attempt   uint32
		errText   string
		priority  int32
		keepClaim bool
		headers   []string
		clearHdrs bool
	)
	cmd := &cobra.Command{
		Use:   "change ID --version V [--attempt N] [--err TEXT] [--priority P]",
		Short: "Set a task's attempt, error or priority",
		Long: `task change sets fields of version V of task ID, as a worker's change does:
--attempt (the retry count a worker keeps), --err (the last error's text;
--err "" clears it), --priority, and the headers: --header KEY=VALUE
(repeatable) replaces them all, --clear-headers removes them. Only the
fields given change. Like any
change it makes a new version and ends the claim, unless --keep-claim.

As with delete, the task is looked up for its queue and the command acts as
its current claimant unless --queue and --claimant are given.

With -o json it prints {"tasks":[TASK]} with the new version.`,
		Example: `  taskctl task change 3f2a9c0e --version 5 --attempt 0 --err ""
  taskctl task change 3f2a9c0e --version 6 --priority 10`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			ch := &taskstorepb.TaskChange{Id: id, Version: ref.version, KeepClaim: keepClaim}
			f := cmd.Flags()
			if f.Changed("attempt") {
				ch.Attempt = &attempt
			}
			if f.Changed("err") {
				ch.Err = &errText
			}
			if f.Changed("priority") {
				ch.Priority = &priority
			}
			if len(headers) > 0 {
				h, err := parseHeaders(headers)
				if err != nil {
					return err
				}
				if clearHdrs {
					return fmt.Errorf("--header replaces the headers and --clear-headers removes them: give one")
				}
				ch.Headers = h
			}
			ch.ClearHeaders = clearHdrs
			if ch.Attempt == nil && ch.Err == nil && ch.Priority == nil && ch.Headers == nil && !ch.ClearHeaders {
				return fmt.Errorf("nothing to change: give --attempt, --err, --priority, --header or --clear-headers")
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				queue, claimant, err := ref.lookup(ctx, c, cmd, id)
				if err != nil {
					return err
				}
				ch.Queue = queue
				resp, err := c.Modify(ctx, &taskstorepb.ModifyRequest{Claimant: claimant, Changes: []*taskstorepb.TaskChange{ch}})
				if err != nil {
					return err
				}
				return a.printTaskList(resp.Changed, "")
			})
		},
	}
	ref.add(cmd)
	fl := cmd.Flags()
	fl.Uint32Var(&attempt, "attempt", 0, "set the task's attempt count")
	fl.StringVar(&errText, "err", "", "set the task's error text (\"\" clears it)")
	fl.Int32Var(&priority, "priority", 0, "set the task's priority")
	fl.BoolVar(&keepClaim, "keep-claim", false, "keep the claim (by default a change ends it)")
	fl.StringArrayVar(&headers, "header", nil, "replace the task's headers with these KEY=VALUE (repeatable)")
	fl.BoolVar(&clearHdrs, "clear-headers", false, "remove every header of the task")
	return cmd
}
