package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
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
		rate       string
		burst      uint32
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

--rate R/s (or R/m, R/h; a bare R is a second) bounds how fast claims take
the queue's tasks: a token bucket of --burst N tokens (default: a tenth of a
second's, at least 1) that refills at the rate, kept by the state machine in
log time, so every replica decides alike. A claim beyond it gets nothing,
as from an empty queue; a claim of several tasks takes as many as there are
tokens; a waiting claim is served when the next token frees. --rate 0
removes the rate.

Flags change only what they name (the rest of the policy stays); --clear
removes the whole policy. It needs the admin role. With -o json it prints the policy; after a change,
{"policy": ..., "previous": ...}, what it is now and what it was.`,
		Example: `  taskctl queue policy crawl/fetch
  taskctl queue policy crawl/fetch --max-claims 3 --dead-letter crawl/dead
  taskctl queue policy crawl/done --retain 168h
  taskctl queue policy crawl/fetch --rate 50/s --burst 10
  taskctl queue policy crawl/fetch --clear`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			queue := args[0]
			change := cmd.Flags().Changed("max-claims") || cmd.Flags().Changed("dead-letter") || cmd.Flags().Changed("retain") ||
				cmd.Flags().Changed("rate") || cmd.Flags().Changed("burst") || clear
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
					next.Rate, next.Burst = cur.Rate, cur.Burst
				}
				if cmd.Flags().Changed("rate") {
					r, err := parseRate(rate)
					if err != nil {
						return err
					}
					next.Rate, next.Burst = r, 0 // a new rate: the default burst unless --burst
				}
				if cmd.Flags().Changed("burst") {
					if next.Rate == 0 {
						return fmt.Errorf("--burst %d: needs a rate (--rate)", burst)
					}
					next.Burst = burst
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
				// What the cluster holds now, defaults filled in (a burst).
				if now, err := c.QueuePolicy(ctx, queue); err == nil {
					next = now
				}
				if a.output == "json" {
					// {"policy": what it is now, "previous": what it was}
					out := map[string]json.RawMessage{}
					for k, p := range map[string]*taskstorepb.QueuePolicy{"policy": next, "previous": prev} {
						if out[k], err = protojson.Marshal(orNoPolicy(p)); err != nil {
							return err
						}
					}
					return printJSONValue(a.stdout, out)
				}
				fmt.Fprintf(a.stdout, "%s: %s (was %s)\n", queue, policySentence(next), policySentence(prev))
				return nil
			})
		},
	}
	cmd.Flags().Uint32Var(&maxClaims, "max-claims", 0, "move a task claimed this many times, whose last lease ran out, to --dead-letter (0: no limit)")
	cmd.Flags().StringVar(&deadLetter, "dead-letter", "", "the dead-letter queue of --max-claims (same consistency group)")
	cmd.Flags().DurationVar(&retain, "retain", 0, "delete the queue's tasks older than this since their insert (0: keep them)")
	cmd.Flags().StringVar(&rate, "rate", "", "claim at most this many of the queue's tasks a second (R/s, R/m, R/h; 0: no rate)")
	cmd.Flags().Uint32Var(&burst, "burst", 0, "with --rate, the most tasks claimed at once after a pause (default: a tenth of a second's, at least 1)")
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
	if p.GetRate() > 0 {
		parts = append(parts, fmt.Sprintf("claims take its tasks at no more than %s, in bursts of up to %d", formatRate(p.Rate), p.Burst))
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
	if p.GetRate() > 0 {
		parts = append(parts, fmt.Sprintf("rate %s burst %d", formatRate(p.Rate), p.Burst))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// parseRate reads a --rate: R/s, R/m or R/h (a bare R is a second), as
// tasks a second.
func parseRate(s string) (float64, error) {
	num, unit, _ := strings.Cut(strings.TrimSpace(s), "/")
	per := map[string]float64{"": 1, "s": 1, "m": 60, "h": 3600}[unit]
	r, err := strconv.ParseFloat(num, 64)
	if err != nil || per == 0 || r < 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		return 0, fmt.Errorf("--rate %q: want a number of tasks of 0 or more per s, m or h (50/s, 10/m, 2/h)", s)
	}
	return r / per, nil
}

// formatRate writes tasks a second as parseRate reads them.
func formatRate(r float64) string {
	switch {
	case r >= 1:
		return strconv.FormatFloat(r, 'g', 4, 64) + "/s"
	case r*60 >= 1:
		return strconv.FormatFloat(r*60, 'g', 4, 64) + "/m"
	}
	return strconv.FormatFloat(r*3600, 'g', 4, 64) + "/h"
}
