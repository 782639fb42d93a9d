package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

func (a *app) queueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Inspect, pause, purge and move queues",
		Long: `queue groups the commands about queues. A queue exists while it holds tasks
(or is paused); its consistency group (the name before the first '/') decides
its shard.`,
		Example: `  taskctl queue list crawl/
  taskctl queue stats crawl/fetch
  taskctl queue pause crawl/fetch
  taskctl queue move crawl/dead crawl/fetch --reset-attempts`,
	}

	var limit uint32
	list := &cobra.Command{
		Use:   "list [PREFIX]",
		Short: "List queues with task counts",
		Long: `queue list asks every shard's leader for its queues whose names start with
PREFIX (all queues without one) and prints them sorted by name with their
shard and counts: total, available (claimable now), claimed (under an
unexpired lease), delayed (not yet available), the age of the oldest
available task, whether it is paused (queue pause) and its concurrency limit
(queue limit): a queue with either is listed even when it holds no tasks.

With -o json it prints a QueuesResponse: {"queues":[...]}.`,
		Example: `  taskctl queue list
  taskctl queue list crawl/
  taskctl -o json queue list | jq -r '.queues[] | select(.available != null) | .name'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Queues(ctx, &taskstorepb.QueuesRequest{Prefix: prefix, Limit: limit})
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, resp)
				}
				return printQueues(a.stdout, resp.Queues)
			})
		},
	}
	list.Flags().Uint32Var(&limit, "limit", 0, "list at most this many queues (0: no limit)")

	stats := &cobra.Command{
		Use:   "stats QUEUE",
		Short: "Show the task counts of one queue",
		Long: `queue stats prints one queue's shard and counts: total, available, claimed,
delayed, and the age of the oldest available task; then its enqueue, claim and
commit rates over the last minute and the average time from claim to commit,
as the shard's leader measured them (they start afresh when leadership moves).
A queue that holds no task does not exist; its counts are printed as zero.

With -o json it prints a QueuesResponse with that one queue.`,
		Example: `  taskctl queue stats crawl/fetch
  taskctl -o json queue stats crawl/fetch | jq '.queues[0].available // 0'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				qs, err := c.ListQueues(ctx, name)
				if err != nil {
					return err
				}
				q := &taskstorepb.QueueStats{Name: name}
				for _, s := range qs {
					if s.Name == name {
						q = s
					}
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.QueuesResponse{Queues: []*taskstorepb.QueueStats{q}})
				}
				return printQueueDetail(a.stdout, q)
			})
		},
	}

	purge := &cobra.Command{
		Use:   "purge QUEUE",
		Short: "Delete every task of a queue",
		Long: `queue purge deletes every task of a queue, claimed or not, in one command on
the shard that owns it (fast: not one transaction per task). Workers holding
tasks of the queue find them gone: their commits are refused as missing.
There is no undo.`,
		Example: `  taskctl queue purge crawl/fetch`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				n, err := c.Purge(ctx, args[0])
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.PurgeResponse{Deleted: n})
				}
				fmt.Fprintf(a.stdout, "purged %s: %d task(s) deleted\n", args[0], n)
				return nil
			})
		},
	}

	var (
		moveFilter    filterFlags
		resetAttempts bool
		moveBatch     int
	)
	move := &cobra.Command{
		Use:   "move SRC DST",
		Short: "Move the tasks of a queue to another queue of its group",
		Long: `queue move moves every task of SRC, or those the filters select, to DST, a
queue of the same consistency group: the dead-letter queue back to work, say.
It moves --batch tasks per transaction, so a queue of a million tasks moves in
many small log entries, and prints its progress on standard error.

Tasks with a live lease are not moved (their holders would lose them): the
summary says how many a worker still held at the end ("N claimed task(s) left
in SRC"); move again after their leases end. A task that changes while it is
being moved (claimed, changed by a producer), or that arrived in SRC after the
move started (a task failing again on its way back, say), is left alone and
counted as skipped; one whose key DST already holds cannot move and is
reported as a conflict. --reset-attempts sets each moved task's attempt to 0
and clears its err; without it both are kept. The filters are those of task
list. It runs until done or interrupted (Ctrl-C stops it between batches; what
moved stays moved); --timeout bounds each request, not the move. A move it
refuses (across groups, onto SRC itself) prints only the error.

With -o json it prints {"moved","skipped","conflicts","conflictIds","claimed"}.`,
		Example: `  taskctl queue move crawl/dead crawl/fetch --reset-attempts
  taskctl queue move crawl/dead crawl/fetch --err timeout --min-attempt 3`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			filter, err := moveFilter.request(false)
			if err != nil {
				return err
			}
			return a.withClient(365*24*time.Hour, func(ctx context.Context, c *client.Client) error {
				res, err := c.MoveQueue(ctx, args[0], args[1], client.MoveOptions{Filter: filter, ResetAttempts: resetAttempts, Batch: moveBatch,
					RequestTimeout: a.timeout,
					Progress: func(r client.MoveResult) {
						if a.output != "json" {
							fmt.Fprintf(a.stderr, "moved %d, skipped %d, conflicts %d\n", r.Moved, r.Skipped, r.Conflicts)
						}
					}})
				if err != nil && res.Moved+res.Skipped+res.Conflicts+res.Claimed == 0 {
					// Refused before anything happened (across groups, a
					// bad batch) or failed at once: no summary of nothing.
					return err
				}
				if a.output == "json" {
					if perr := printJSONValue(a.stdout, map[string]any{"moved": res.Moved, "skipped": res.Skipped,
						"conflicts": res.Conflicts, "conflictIds": res.ConflictIDs, "claimed": res.Claimed}); perr != nil {
						return perr
					}
				} else {
					fmt.Fprintf(a.stdout, "moved %d task(s) from %s to %s, skipped %d\n", res.Moved, args[0], args[1], res.Skipped)
					if res.Conflicts > 0 {
						fmt.Fprintf(a.stdout, "%d task(s) could not move (a key taken in %s), among them: %s\n", res.Conflicts, args[1], strings.Join(res.ConflictIDs, " "))
					}
					if res.Claimed > 0 {
						fmt.Fprintf(a.stdout, "%d claimed task(s) left in %s (a worker holds them; move again after their leases end)\n", res.Claimed, args[0])
					}
				}
				return err
			})
		},
	}
	moveFilter.add(move, "available or delayed")
	mf := move.Flags()
	mf.BoolVar(&resetAttempts, "reset-attempts", false, "set each moved task's attempt to 0 and clear its err")
	mf.IntVar(&moveBatch, "batch", 500, "tasks per transaction (1-1000; a batch of large values is split as needed)")

	pause := &cobra.Command{
		Use:   "pause QUEUE",
		Short: "Stop a queue from handing out claims",
		Long: `queue pause stops QUEUE from handing out claims until queue resume: producers
go on inserting, workers' claims find nothing in it (a claim of several queues
takes from the others), waiting claims stay parked, and tasks already claimed
keep their leases and may be committed. The pause is replicated: it holds
across leader changes and restarts, and shows in queue list, queue stats, the
status page and taskstore_queue_paused. Pausing a paused queue is no error.
It needs the admin role.`,
		Example: `  taskctl queue pause crawl/fetch
  taskctl queue resume crawl/fetch`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.setPaused(args[0], true)
		},
	}
	resume := &cobra.Command{
		Use:   "resume QUEUE",
		Short: "Let a paused queue hand out claims again",
		Long: `queue resume undoes queue pause: QUEUE hands out claims again and waiting
claims wake at once. Resuming a queue that is not paused is no error. It
needs the admin role.`,
		Example: `  taskctl queue resume crawl/fetch`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.setPaused(args[0], false)
		},
	}

	limitCmd := &cobra.Command{
		Use:   "limit QUEUE N",
		Short: "Bound how many of a queue's tasks are claimed at once",
		Long: `queue limit lets at most N tasks of QUEUE be claimed at once, across all
workers: a claim that would exceed it takes fewer or none, and waiting claims
wake when a claim ends (a commit, a release, a lease running out). N = 0
removes the limit. Lowering it below what is claimed now takes nothing back:
new claims wait until enough end. The limit is replicated (it survives leader
changes and restarts) and shows as LIMIT in queue list and "max claimed" in
queue stats. It needs the admin role.`,
		Example: `  taskctl queue limit crawl/fetch 10     # at most 10 fetches at a time
  taskctl queue limit crawl/fetch 0      # no limit`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.ParseUint(args[1], 10, 32)
			if err != nil {
				return fmt.Errorf("limit %q is not a whole number of tasks (0 removes the limit)", args[1])
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				prev, err := c.SetQueueLimit(ctx, args[0], uint32(n))
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.QueueLimitResponse{Previous: prev})
				}
				now := "no limit"
				if n > 0 {
					now = fmt.Sprintf("at most %d claimed at once", n)
				}
				fmt.Fprintf(a.stdout, "%s: %s (was %s)\n", args[0], now, limitSentence(prev))
				return nil
			})
		},
	}

	cmd.AddCommand(list, stats, pause, resume, limitCmd, a.queuePolicyCmd(), purge, move)
	return cmd
}

// setPaused pauses or resumes a queue and says what changed.
func (a *app) setPaused(queue string, paused bool) error {
	return a.withClient(0, func(ctx context.Context, c *client.Client) error {
		set, verb := c.ResumeQueue, "resumed"
		if paused {
			set, verb = c.PauseQueue, "paused"
		}
		was, err := set(ctx, queue)
		if err != nil {
			return err
		}
		if a.output == "json" {
			return printJSON(a.stdout, &taskstorepb.QueuePauseResponse{WasPaused: was})
		}
		switch {
		case was && paused:
			fmt.Fprintf(a.stdout, "%s was already paused\n", queue)
		case !was && !paused:
			fmt.Fprintf(a.stdout, "%s was not paused\n", queue)
		default:
			fmt.Fprintf(a.stdout, "%s %s\n", queue, verb)
		}
		return nil
	})
}

// limitWord is how tables show a queue's concurrency limit.
func limitWord(n uint32) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(uint64(n), 10)
}

// limitSentence is how a sentence says a queue's concurrency limit.
func limitSentence(n uint32) string {
	if n == 0 {
		return "no limit"
	}
	return strconv.FormatUint(uint64(n), 10)
}

// emptyClaimHint says why a claim of queues found nothing when one of them
// is paused or at its concurrency limit (a claim's answer does not say).
func emptyClaimHint(ctx context.Context, c *client.Client, queues []string) string {
	var why []string
	for _, name := range queues {
		qs, err := c.ListQueues(ctx, name)
		if err != nil {
			return ""
		}
		for _, q := range qs {
			if q.Name == name {
				if w := queueHint(q); w != "" {
					why = append(why, w)
				}
			}
		}
	}
	if len(why) == 0 {
		return ""
	}
	return ": " + strings.Join(why, "; ")
}

// queueHint says why a claim of q finds nothing although it may hold
// available tasks: paused, or at (or, after a lowered limit, over) its
// concurrency limit; "" when neither.
func queueHint(q *taskstorepb.QueueStats) string {
	return taskstorepb.QueueHoldReason(q.Name, q.Paused, q.MaxClaimed, q.Claimed)
}

// pausedWord is how tables show a queue's pause.
func pausedWord(paused bool) string {
	if paused {
		return "yes"
	}
	return "-"
}

// printQueueDetail prints one queue's counts and rates, a line each.
func printQueueDetail(w io.Writer, q *taskstorepb.QueueStats) error {
	age := "-"
	if q.OldestAvailableAge != nil {
		age = q.OldestAvailableAge.AsDuration().Round(time.Millisecond).String()
	}
	avg := "-"
	if q.AvgClaimToCommit != nil {
		avg = q.AvgClaimToCommit.AsDuration().Round(time.Millisecond).String()
	}
	window := "1m0s"
	if q.RateWindow != nil {
		window = q.RateWindow.AsDuration().String()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "queue\t%s\n", q.Name)
	fmt.Fprintf(tw, "shard\t%d\n", q.Shard)
	fmt.Fprintf(tw, "total\t%d\n", q.Total)
	fmt.Fprintf(tw, "available\t%d\n", q.Available)
	fmt.Fprintf(tw, "claimed\t%d\n", q.Claimed)
	fmt.Fprintf(tw, "delayed\t%d\n", q.Delayed)
	fmt.Fprintf(tw, "oldest available\t%s\n", age)
	fmt.Fprintf(tw, "paused\t%s\n", pausedWord(q.Paused))
	fmt.Fprintf(tw, "max claimed\t%s\n", limitWord(q.MaxClaimed))
	if q.Policy != nil {
		fmt.Fprintf(tw, "policy\t%s\n", policyColumn(q.Policy))
	}
	fmt.Fprintf(tw, "enqueue rate\t%.2f/s (over %s)\n", q.EnqueueRate, window)
	fmt.Fprintf(tw, "claim rate\t%.2f/s\n", q.ClaimRate)
	fmt.Fprintf(tw, "commit rate\t%.2f/s\n", q.CommitRate)
	fmt.Fprintf(tw, "avg claim to commit\t%s\n", avg)
	return tw.Flush()
}
