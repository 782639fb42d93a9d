package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

func (a *app) queuePolicyCmd() *cobra.Command {
	var (
		maxClaims  uint32
		deadLetter string
		retain     time.Duration
		clear      bool
	)
	cmd := &cobra.Command{
		Use:   "policy QUEUE",
		Short: "Show or set the rules the server enforces on a queue",
		Long: `queue policy shows QUEUE's policy, or with flags changes it: the rules the
state machine enforces on the queue's tasks, the same on every replica, kept
through snapshots, slot moves, backups and restarts.

--max-claims N --dead-letter QUEUE2 is the delivery limit: a task claimed N
times whose last lease ran out without a commit (its worker crashed, or hung
past the lease: a poison task) is moved to QUEUE2, a queue of the same
consistency group, by the claim that would take it once more, instead of
being claimed. The moved task keeps its value, attempt and last claimant,
gets an error saying why (unless it had one) and the headers
dead-letter-from (the queue it came from) and dead-letter-claims; its claim
count starts again at 0, so "taskctl queue move QUEUE2 QUEUE" sends it back
for N more claims. A claim that ended with a commit (a retry that changed
the task) leaves the task claimable however often it was claimed.
--max-claims 0 removes the limit.

--retain DURATION deletes the queue's tasks older than that since their
insert: the leader walks the queue in small steps (a thousand tasks each), so
a huge expiry never stalls the shard, and a task under a live lease waits for
its end. For "done" and dead-letter queues that must not grow forever.
--retain 0 keeps tasks until deleted.

Flags change only what they name (the rest of the policy stays); --clear
removes the whole policy. It needs the admin role. With -o json it prints
the policy (after a change, {"previous": ...} too).`,
		Example: `  taskctl queue policy crawl/fetch
  taskctl queue policy crawl/fetch --max-claims 3 --dead-letter crawl/dead
  taskctl queue policy crawl/done --retain 168h
  taskctl queue policy crawl/fetch --clear`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			queue := args[0]
			change := cmd.Flags().Changed("max-claims") || cmd.Flags().Changed("dead-letter") || cmd.Flags().Changed("retain") || clear
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				cur, err := c.QueuePolicy(ctx, queue)
				if err != nil {
					return err
				}
				if !change {
					if a.output == "json" {
						return printJSON(a.stdout, orNoPolicy(cur))
					}
					fmt.Fprintf(a.stdout, "%s: %s\n", queue, policySentence(cur))
					return nil
				}
				next := &taskstorepb.QueuePolicy{}
				if cur != nil && !clear {
					next.MaxClaims, next.DeadLetter, next.Retain = cur.MaxClaims, cur.DeadLetter, cur.Retain
				}
				if cmd.Flags().Changed("retain") {
					if retain < 0 {
						return fmt.Errorf("--retain %s: a duration of 0 or more", retain)
					}
					next.Retain = nil
					if retain > 0 {
						next.Retain = durationpb.New(retain)
					}
				}
				if cmd.Flags().Changed("max-claims") {
					next.MaxClaims = maxClaims
					if maxClaims == 0 && !cmd.Flags().Changed("dead-letter") {
						next.DeadLetter = "" // no limit: no dead-letter queue
					}
				}
				if cmd.Flags().Changed("dead-letter") {
					next.DeadLetter = deadLetter
				}
				prev, err := c.SetQueuePolicy(ctx, queue, next)
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.QueuePolicyResponse{Previous: prev})
				}
				fmt.Fprintf(a.stdout, "%s: %s (was %s)\n", queue, policySentence(next), policySentence(prev))
				return nil
			})
		},
	}
	cmd.Flags().Uint32Var(&maxClaims, "max-claims", 0, "move a task claimed this many times, whose last lease ran out, to --dead-letter (0: no limit)")
	cmd.Flags().StringVar(&deadLetter, "dead-letter", "", "the dead-letter queue of --max-claims (same consistency group)")
	cmd.Flags().DurationVar(&retain, "retain", 0, "delete the queue's tasks older than this since their insert (0: keep them)")
	cmd.Flags().BoolVar(&clear, "clear", false, "remove the queue's policy")
	return cmd
}

// orNoPolicy is p, or an empty policy for none (JSON prints {}).
func orNoPolicy(p *taskstorepb.QueuePolicy) *taskstorepb.QueuePolicy {
	if p == nil {
		return &taskstorepb.QueuePolicy{}
	}
	return p
}

// policySentence says what a policy enforces.
func policySentence(p *taskstorepb.QueuePolicy) string {
	var parts []string
	if p.GetMaxClaims() > 0 {
		parts = append(parts, fmt.Sprintf("a task claimed %d times whose last lease ran out moves to %s", p.MaxClaims, p.DeadLetter))
	}
	if r := p.GetRetain().AsDuration(); r > 0 {
		parts = append(parts, fmt.Sprintf("tasks older than %s are deleted", r))
	}
	if len(parts) == 0 {
		return "no policy"
	}
	return strings.Join(parts, "; ")
}

// policyColumn is a policy in a queue list's POLICY column.
func policyColumn(p *taskstorepb.QueuePolicy) string {
	var parts []string
	if p.GetMaxClaims() > 0 {
		parts = append(parts, fmt.Sprintf("max-claims %d → %s", p.MaxClaims, p.DeadLetter))
	}
	if r := p.GetRetain().AsDuration(); r > 0 {
		parts = append(parts, fmt.Sprintf("retain %s", r))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
