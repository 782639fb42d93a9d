package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

// reshardWait bounds how long a resharding command waits for its moves
// (each move takes a fraction of a second; a rebalance of a big cluster
// records hundreds).
const reshardWait = 30 * time.Minute

// shardAddCmd is `taskctl shard add`.
func (a *app) shardAddCmd() *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "add [--count N]",
		Short: "Add shards (Raft groups) to the live cluster",
		Long: `shard add creates N new shards. Their replicas are placed like any other
shard's (the least loaded nodes), and their Raft groups start at once: the
command returns once each new shard has a leader, so a listing right after it
shows them running. A new
shard serves no hash slot, and so holds no task, until slots move to it:
run "taskctl shard rebalance" afterwards to give every shard its share.

Add shards when the cluster grows (after "taskctl node add") so that more
nodes lead shards and writes spread over more Raft groups. Every node must
run a version that moves slots.

With -o json it prints the AddShardsResponse.`,
		Example: `  taskctl shard add --count 2
  taskctl shard rebalance`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 || count > 64 {
				return fmt.Errorf("--count %d: add 1 to 64 shards at a time", count)
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				added, err := c.AddShards(ctx, count)
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.AddShardsResponse{Shards: added})
				}
				if len(added) == 0 {
					fmt.Fprintln(a.stdout, "no shard added: the cluster has the shards asked for already (a retried request)")
					return nil
				}
				for _, s := range added {
					fmt.Fprintf(a.stdout, "shard %d added on %s (preferred leader %s)\n", s.Id, strings.Join(s.Replicas, ","), s.PreferredLeader)
				}
				if err := a.waitLeaders(ctx, c, added); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, "New shards serve no slot yet: run taskctl shard rebalance to give them their share.")
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, "how many shards to add")
	return cmd
}

// waitLeaders waits until each added shard has a leader in the cluster's
// status, so that a listing right after the command shows it running.
func (a *app) waitLeaders(ctx context.Context, c *client.Client, added []*taskstorepb.ShardStatus) error {
	said := false
	for {
		st, err := c.Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			return err
		}
		var waiting []string
		for _, s := range added {
			i := slices.IndexFunc(st.Shards, func(ss *taskstorepb.ShardStatus) bool { return ss.Id == s.Id && ss.Leader != "" })
			if i < 0 {
				waiting = append(waiting, strconv.FormatUint(uint64(s.Id), 10))
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if !said {
			fmt.Fprintf(a.stdout, "waiting for shard %s to start its Raft group and elect a leader\n", strings.Join(waiting, ","))
			said = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("shard %s added but without a leader yet: %w", strings.Join(waiting, ","), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// shardRemoveCmd is `taskctl shard remove`.
func (a *app) shardRemoveCmd() *cobra.Command {
	var noWait bool
	cmd := &cobra.Command{
		Use:   "remove SHARD",
		Short: "Move a shard's slots to the other shards, then retire it",
		Long: `shard remove marks SHARD retiring (no slot moves to it any more), moves each
of its hash slots to the other shards (the ones with the fewest slots first),
and once it serves no slot removes it from the cluster map; its replicas then
delete their copy of its Raft group. The tasks it held are on the other shards
by then. Writers of a slot see Unavailable for the moment its state moves;
the Go client, taskctl and proxies retry on their own.

The command waits until the moves are done (with progress) and the shard is
gone from the map, its replicas' copies deleted (a second or two); --no-wait returns once the moves are recorded. The last shard that
serves slots cannot be removed.`,
		Example: `  taskctl shard remove 3`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			shard, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil || shard == 0 {
				return fmt.Errorf("shard %q: want a shard id (a positive number, see shard list)", args[0])
			}
			return a.withClient(reshardWait, func(ctx context.Context, c *client.Client) error {
				moves, err := c.RemoveShard(ctx, uint32(shard))
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "shard %d is retiring: %d slot moves recorded\n", shard, len(moves))
				if noWait {
					return nil
				}
				if err := a.waitMoves(ctx, c, moves); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "shard %d serves no slot: waiting for it to leave the cluster map and its replicas to delete their copy\n", shard)
				for {
					st, err := c.Status(ctx, &taskstorepb.StatusRequest{})
					if err != nil {
						return err
					}
					if !slices.ContainsFunc(st.Shards, func(s *taskstorepb.ShardStatus) bool { return s.Id == uint32(shard) }) {
						fmt.Fprintf(a.stdout, "shard %d removed\n", shard)
						return nil
					}
					select {
					case <-ctx.Done():
						return fmt.Errorf("shard %d serves no slot but is still in the map: %w", shard, ctx.Err())
					case <-time.After(250 * time.Millisecond):
					}
				}
			})
		},
	}
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the moves are recorded")
	return cmd
}

// shardRebalanceCmd is `taskctl shard rebalance`.
func (a *app) shardRebalanceCmd() *cobra.Command {
	var noWait, dryRun bool
	cmd := &cobra.Command{
		Use:   "rebalance [--dry-run]",
		Short: "Move slots so that every shard serves a fair share",
		Long: `shard rebalance moves hash slots between shards until every shard serves
the same number of slots, within one. Among a shard's slots it gives away
first those whose tasks even out the shards' task counts (the heaviest,
while that keeps the receiver lighter than the giver), else the lightest,
which are the cheapest to copy. Run it after shard add or node add.

--dry-run prints the plan (how many slots go from which shard to which)
without moving anything. Otherwise the command waits until the moves are
done, printing progress; --no-wait returns once they are recorded.`,
		Example: `  taskctl shard add --count 2
  taskctl shard rebalance --dry-run
  taskctl shard rebalance`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(reshardWait, func(ctx context.Context, c *client.Client) error {
				moves, err := c.RebalanceSlots(ctx, dryRun)
				if err != nil {
					return err
				}
				if a.output == "json" && (dryRun || noWait) {
					return printJSON(a.stdout, &taskstorepb.RebalanceSlotsResponse{Moves: moves})
				}
				if len(moves) == 0 {
					fmt.Fprintln(a.stdout, "balanced: no slot to move")
					return nil
				}
				verb := "moving"
				if dryRun {
					verb = "would move"
				}
				printMovePlan(a.stdout, verb, moves)
				if dryRun || noWait {
					return nil
				}
				return a.waitMoves(ctx, c, moves)
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan only")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the moves are recorded")
	return cmd
}

// printMovePlan sums moves up by source and target.
func printMovePlan(w io.Writer, verb string, moves []*taskstorepb.SlotMove) {
	type pair struct{ from, to uint32 }
	n := map[pair]int{}
	var pairs []pair
	for _, m := range moves {
		p := pair{m.From, m.To}
		if n[p] == 0 {
			pairs = append(pairs, p)
		}
		n[p]++
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if a.from != b.from {
			return int(a.from) - int(b.from)
		}
		return int(a.to) - int(b.to)
	})
	fmt.Fprintf(w, "%s %d slots:\n", verb, len(moves))
	for _, p := range pairs {
		fmt.Fprintf(w, "  shard %d -> shard %d: %d slots\n", p.from, p.to, n[p])
	}
}

// waitMoves waits for moves, printing a line when the count under way
// changes (at most every 2 s).
func (a *app) waitMoves(ctx context.Context, c *client.Client, moves []*taskstorepb.SlotMove) error {
	if len(moves) == 0 {
		return nil
	}
	start, last, printed := time.Now(), -1, time.Time{}
	err := c.WaitMoves(ctx, moves, func(under []*taskstorepb.SlotMove) {
		if len(under) == last || time.Since(printed) < 2*time.Second && len(under) > 0 {
			return
		}
		last, printed = len(under), time.Now()
		fmt.Fprintf(a.stdout, "  %d of %d moves done (%s)\n", len(moves)-len(under), len(moves), time.Since(start).Round(100*time.Millisecond))
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "%d slot moves done in %s\n", len(moves), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// slotCmd is `taskctl slot`.
func (a *app) slotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "slot",
		Short: "Find a group's hash slot and move slots between shards",
		Long: `slot groups the commands about hash slots. A queue's consistency group (the
text before its first '/') lives in one of 1024 hash slots (FNV-1a of the
group, mod 1024), and the routing table says which shard serves each slot.
Moving a slot moves every group in it, with their tasks, keys, pauses,
limits, schedules and exactly-once records.`,
		Example: `  taskctl slot of mail/outbox
  taskctl slot move 17,18,100-103 --to 3
  taskctl slot moves`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "of QUEUE|GROUP",
		Short: "Print the hash slot of a queue's group and the shard that serves it",
		Long: `slot of prints the consistency group of QUEUE (the text before its first
'/'; a name without '/' is a group), the hash slot the group lives in, and
the shard that serves that slot now. Every queue of a group moves with it.`,
		Example: `  taskctl slot of mail/outbox
  taskctl slot move $(taskctl slot of mail/outbox | sed 's/.*slot \([0-9]*\).*/\1/') --to 3`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				rt, err := c.Routing(ctx)
				if err != nil {
					return err
				}
				group := taskstorepb.GroupOf(args[0])
				slot := taskstorepb.SlotOf(group, len(rt.Slots))
				fmt.Fprintf(a.stdout, "group %q: slot %d, served by shard %d\n", group, slot, rt.Slots[slot])
				return nil
			})
		},
	})
	var to uint64
	var noWait bool
	move := &cobra.Command{
		Use:   "move SLOT[,SLOT|FROM-TO...] --to SHARD",
		Short: "Move hash slots to another shard on the live cluster",
		Long: `slot move moves the given hash slots to shard SHARD. For each slot: its
shard stops taking the slot's writes (callers see Unavailable and retry; the
Go client, taskctl and proxies do it on their own), the slot's state is
copied to SHARD through SHARD's Raft log, the routing table flips, SHARD
serves the slot and the old shard deletes its copy. The other slots of both
shards are served throughout. A move that cannot finish (SHARD lost its
quorum for 30 s, say) is undone: the slot stays where it was.

The command waits for the moves with progress; --no-wait returns once they
are recorded (taskctl slot moves lists them).`,
		Example: `  taskctl slot move 17 --to 3
  taskctl slot move 100-163 --to 4 --no-wait`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			slots, err := parseSlots(args[0])
			if err != nil {
				return err
			}
			if to == 0 {
				return fmt.Errorf("--to is required: the shard to move the slots to (see shard list)")
			}
			return a.withClient(reshardWait, func(ctx context.Context, c *client.Client) error {
				moves, err := c.MoveSlots(ctx, slots, uint32(to))
				if err != nil {
					return err
				}
				if len(moves) == 0 {
					fmt.Fprintf(a.stdout, "shard %d serves every slot given already\n", to)
					return nil
				}
				printMovePlan(a.stdout, "moving", moves)
				if noWait {
					return nil
				}
				return a.waitMoves(ctx, c, moves)
			})
		},
	}
	move.Flags().Uint64Var(&to, "to", 0, "the shard to move the slots to")
	move.Flags().BoolVar(&noWait, "no-wait", false, "return once the moves are recorded")
	cmd.AddCommand(move)
	cmd.AddCommand(&cobra.Command{
		Use:   "moves",
		Short: "List slot moves under way and the last ones finished",
		Long: `slot moves lists the moves under way (phase copying: the source refuses the
slot's writes while its state is copied; flipped: the routing table names the
target, the source deletes its copy; aborting: being undone) and the last
moves finished (done, or aborted with the reason).

With -o json it prints {"moves": [...], "finishedMoves": [...]}.`,
		Example: `  taskctl slot moves
  taskctl -o json slot moves | jq '.finishedMoves[] | select(.phase == "aborted")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.status(func(st *taskstorepb.StatusResponse) error {
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.StatusResponse{Moves: st.Moves, FinishedMoves: st.FinishedMoves})
				}
				t := newTable(a.stdout, "MOVE", "SLOT", "FROM", "TO", "PHASE", "ERROR")
				for _, m := range append(slices.Clone(st.Moves), st.FinishedMoves...) {
					t.row(u64(m.Id), u64(uint64(m.Slot)), u64(uint64(m.From)), u64(uint64(m.To)), m.Phase, orDash(m.Error))
				}
				return t.flush()
			})
		},
	})
	return cmd
}

// parseSlots parses "17,18,100-103".
func parseSlots(s string) ([]uint32, error) {
	var out []uint32
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("slot %q: want a slot number (0-1023), a range FROM-TO, or a list of them", part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil || b < a {
				return nil, fmt.Errorf("slot range %q: want FROM-TO with FROM <= TO", part)
			}
		}
		if b-a > 1<<16 {
			return nil, fmt.Errorf("slot range %q is too long", part)
		}
		for v := a; v <= b; v++ {
			out = append(out, uint32(v))
		}
	}
	return out, nil
}
