package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
)

func (a *app) status(fn func(resp *taskstorepb.StatusResponse) error) error {
	return a.withClient(0, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			return err
		}
		return fn(resp)
	})
}

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show nodes and shards: leaders, health and replication lag",
		Long: `status asks one node for the cluster's state and prints two tables.

NODES: each node's id, gRPC address, state (member: in the cluster map;
waiting: gossiping, not yet added), health as gossip sees it (alive, suspect,
dead), the shards it replicates and those it leads.

SHARDS: each shard's leader, Raft term, replicas (node ids), hash slots owned,
the tasks it holds (as its leader's replica has them), MEMORY, when the
leader keeps them in memory under a --memory-limit: what they take against
its budget, and the fill (at 100% inserts are refused with RESOURCE_EXHAUSTED
until claims, deletes or purges make room),
the leader's commit and applied index, the largest lag (entries applied
on the leader but not yet on a replica) of any replica, and LOG, the most
Raft log any replica retains (bounded by bytes: taskstored trims it near
64 MiB per replica). The meta group, which
holds the cluster map, is the row "meta". STATE is "ok", or
DIVERGED:NODES for replicas that stopped because their state differs from
the majority's, DAMAGED:NODES for replicas whose files would not open (a
truncated raft.db, a lost term and vote; the node's log says why): repair
both with taskctl shard rebuild. On the meta row, DAMAGED:NODE is a meta
replica whose raft.db was damaged or emptied: it refills from its leader
and does not vote until caught up (role "held"), with nothing to do; or
REPLICAS-DISAGREE when
the replicas' state digests differ with no majority (nothing is stopped; find
the wrong replica from the nodes' logs and rebuild it).
RETIRING marks a shard being removed (taskctl shard remove): its slots move
away. A line after the table counts the slot moves under way.

With -o json it prints the StatusResponse message.`,
		Example: `  taskctl status
  taskctl -o json status | jq '.shards[] | {id, leader}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.status(func(resp *taskstorepb.StatusResponse) error {
				if a.output == "json" {
					return printJSON(a.stdout, resp)
				}
				if resp.Node != "" {
					fmt.Fprintf(a.stdout, "answered by %s\n\n", resp.Node)
				}
				fmt.Fprintln(a.stdout, "NODES")
				if err := printNodes(a.stdout, currentNodes(resp.Nodes)); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, "\nSHARDS")
				if err := printShards(a.stdout, append([]*taskstorepb.ShardStatus{resp.Meta}, resp.Shards...)); err != nil {
					return err
				}
				if len(resp.Moves) > 0 {
					fmt.Fprintf(a.stdout, "\nSLOT MOVES under way: %d (taskctl slot moves)\n", len(resp.Moves))
				}
				return nil
			})
		},
	}
}

func (a *app) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List, add and remove cluster nodes",
		Long:  `node groups the commands about the cluster's nodes.`,
		Example: `  taskctl node list
  taskctl node add n4
  taskctl node remove n2`,
	}
	var noWait, force bool
	var addr string
	add := &cobra.Command{
		Use:   "add ID",
		Short: "Make a waiting node a member; replicas move onto it",
		Long: `node add makes a node that was started with --join (and shows as "waiting"
in node list) a member of the cluster. The controller then places replicas on
it, keeping the replication factor and spreading replicas evenly: each new
replica joins its shard as a non-voter, catches up (snapshot install, then the
log), is promoted, and only then is the surplus replica elsewhere removed.
Shard leaderships are rebalanced too.

The command shows progress until placement has settled; --no-wait returns as
soon as the node is a member.`,
		Example: `  taskstored --id n4 --data-dir data/n4 --listen 127.0.0.1:7104 --gossip 127.0.0.1:7204 --http 127.0.0.1:7304 --join 127.0.0.1:7201 &
  taskctl node add n4`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				if _, err := c.AddNode(ctx, args[0], addr); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "%s is a member\n", args[0])
				if noWait {
					return nil
				}
				return a.waitPlacement(c, args[0], false)
			})
		},
	}
	add.Flags().StringVar(&addr, "addr", "", "the node's gRPC address (default: the one it gossips)")
	add.Flags().BoolVar(&noWait, "no-wait", false, "return once the node is a member, without waiting for placement")
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Drain a node and remove it from the cluster",
		Long: `node remove drains a node: each of its replicas is replaced on another node
first (the replacement catches up and is promoted before the old replica is
removed), its leaderships are handed off, and then it leaves the meta group.
It refuses when fewer members than the replication factor would remain.

--force is for a node that is dead for good: it leaves the meta group at once
and its replicas are replaced (dead voters are removed before replacements
are added), even below the replication factor.`,
		Example: `  taskctl node remove n2
  taskctl node remove n3 --force    # n3's disk is gone`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				if _, err := c.RemoveNode(ctx, args[0], force); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "%s is leaving\n", args[0])
				if noWait {
					return nil
				}
				return a.waitPlacement(c, args[0], true)
			})
		},
	}
	remove.Flags().BoolVar(&force, "force", false, "remove a node that is dead for good, at once")
	remove.Flags().BoolVar(&noWait, "no-wait", false, "return at once, without waiting for the drain")
	cmd.AddCommand(add, remove)
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List nodes with their state, health and shards",
		Long: `node list prints each node's id, gRPC address, state (member, draining,
or waiting to be added), health (alive, suspect, dead), the shards it
replicates and those it leads, as the answering node sees the cluster.
Removed nodes are history: --all lists them too.

With -o json it prints a StatusResponse holding only "nodes".`,
		Example: `  taskctl node list
  taskctl node list --all
  taskctl -o json node list | jq -r '.nodes[] | select(.health != "alive") | .id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.status(func(resp *taskstorepb.StatusResponse) error {
				nodes := resp.Nodes
				if !all {
					nodes = currentNodes(nodes)
				}
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.StatusResponse{Nodes: nodes})
				}
				return printNodes(a.stdout, nodes)
			})
		},
	}
	list.Flags().BoolVar(&all, "all", false, "also list removed nodes")
	cmd.AddCommand(list)
	return cmd
}

// currentNodes leaves out removed nodes: history, listed with --all.
func currentNodes(nodes []*taskstorepb.NodeStatus) []*taskstorepb.NodeStatus {
	return slices.DeleteFunc(slices.Clone(nodes), func(n *taskstorepb.NodeStatus) bool { return n.State == "removed" })
}

func (a *app) shardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "shard",
		Short: "Inspect, add, remove and rebalance shards; move leadership; rebuild replicas",
		Long: `shard groups the commands about shards, the Raft groups that hold the tasks.
Shards can be added and removed on a live cluster; their hash slots move
between them (taskctl slot).`,
		Example: `  taskctl shard list
  taskctl shard add --count 2 && taskctl shard rebalance
  taskctl shard remove 3
  taskctl shard transfer 3 --to n2
  taskctl shard rebuild 3 --node n2`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List shards with leader, term, replicas and lag",
		Long: `shard list prints each shard's id, leader, Raft term, replicas (node ids,
the preferred leader marked with "*": leadership goes back to it while it is
healthy), the number of hash slots it owns, the leader's commit and applied
index and the largest replica lag. The meta group is the row "meta".

With -o json it prints a StatusResponse holding "shards" (and "meta").`,
		Example: `  taskctl shard list
  taskctl -o json shard list | jq '.shards[] | select(.leader == "")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.status(func(resp *taskstorepb.StatusResponse) error {
				if a.output == "json" {
					return printJSON(a.stdout, &taskstorepb.StatusResponse{Shards: resp.Shards, Meta: resp.Meta})
				}
				return printShards(a.stdout, append([]*taskstorepb.ShardStatus{resp.Meta}, resp.Shards...))
			})
		},
	})

	var to string
	transfer := &cobra.Command{
		Use:   "transfer SHARD --to NODE",
		Short: "Move a shard's leadership to another replica",
		Long: `shard transfer asks the shard's current leader to hand leadership to NODE,
one of the shard's replicas (see shard list), and waits until it has. Without
--to the leader picks a replica. Requests in flight on the shard are retried
by clients at the new leader.

With -o json it prints the TransferLeaderResponse.`,
		Example: `  taskctl shard transfer 3 --to n2`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			shard, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil || shard == 0 {
				return fmt.Errorf("shard %q: want a shard id (a positive number, see shard list)", args[0])
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				resp, err := c.TransferLeader(ctx, &taskstorepb.TransferLeaderRequest{Shard: uint32(shard), To: to})
				if err != nil {
					return err
				}
				if a.output == "json" {
					return printJSON(a.stdout, resp)
				}
				if resp.Leader == "" {
					fmt.Fprintf(a.stdout, "shard %d: leadership transferred; the new leader is not known yet (see shard list)\n", shard)
					return nil
				}
				fmt.Fprintf(a.stdout, "shard %d: leader is now %s\n", shard, resp.Leader)
				return nil
			})
		},
	}
	transfer.Flags().StringVar(&to, "to", "", "node id of the new leader (a replica of the shard); empty lets the leader pick")
	cmd.AddCommand(transfer, a.rebuildCmd(), a.shardAddCmd(), a.shardRemoveCmd(), a.shardRebalanceCmd())
	return cmd
}

func (a *app) rebuildCmd() *cobra.Command {
	var node string
	var noWait bool
	cmd := &cobra.Command{
		Use:   "rebuild SHARD --node NODE",
		Short: "Replace a diverged replica with a copy of the healthy ones",
		Long: `shard rebuild repairs a replica that stopped because its state diverged from
the other replicas' (status shows it as "diverged"; the node logged an ERROR
and exports taskstore_shard_diverged{shard} = 1). Replicas compare digests of
their state at the same log index every 30 s; a replica whose digest differs
from the one a majority of the shard's voters agree on stops serving and
voting for that shard, and stays stopped across restarts, so that it can be
examined: its files stay in <data-dir>/shards/SHARD until this command.

The rebuild goes through Raft membership, never by deleting files under a
live voter (a voter that loses its log can vote twice in one term):
  1. the shard's leader removes NODE's replica from the shard's Raft group;
  2. NODE deletes its copy of the shard (the marker that kept it stopped
     included) and starts an empty replica;
  3. the leader adds it back as a non-voter, it catches up (by snapshot, then
     the log), and is promoted to voter once it trails by little.
Copy <data-dir>/shards/SHARD away first if you want to keep the evidence.

It refuses a replica that is not diverged. The command waits until the
replica votes again and has caught up; --no-wait returns after step 2.`,
		Example: `  taskctl status                      # shard 3 on n2 shows "diverged"
  taskctl shard rebuild 3 --node n2`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			shard, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil || shard == 0 {
				return fmt.Errorf("shard %q: want a shard id (a positive number, see shard list)", args[0])
			}
			if node == "" {
				return fmt.Errorf("--node is required: the node whose replica diverged (see taskctl status)")
			}
			return a.withClient(0, func(ctx context.Context, c *client.Client) error {
				if err := c.RebuildReplica(ctx, uint32(shard), node); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "shard %d: %s's replica was removed and deleted; it rejoins from the leader\n", shard, node)
				if noWait {
					return nil
				}
				return a.waitRebuilt(c, uint32(shard), node)
			})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "node id of the diverged replica")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the replica was deleted, without waiting for it to catch up")
	return cmd
}

// waitRebuilt prints progress until a rebuilt replica votes and has caught
// up with the shard.
func (a *app) waitRebuilt(c *client.Client, shard uint32, node string) error {
	last := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		st, err := c.Status(ctx, &taskstorepb.StatusRequest{})
		cancel()
		if err != nil {
			return err
		}
		msg := fmt.Sprintf("shard %d: %s has not rejoined yet", shard, node)
		done := false
		for _, s := range st.Shards {
			if s.Id != shard {
				continue
			}
			for _, rs := range s.ReplicaStatus {
				if rs.Node != node {
					continue
				}
				msg = fmt.Sprintf("shard %d: %s is %s, %d entries behind", shard, node, rs.Role, rs.Lag)
				done = (rs.Role == "follower" || rs.Role == "leader") && rs.Lag < 1000
			}
		}
		if msg != last {
			fmt.Fprintln(a.stdout, msg)
			last = msg
		}
		if done {
			fmt.Fprintf(a.stdout, "shard %d: %s's replica is rebuilt\n", shard, node)
			return nil
		}
		time.Sleep(time.Second)
	}
}

// waitPlacement prints progress until placement has settled (and, when
// leaving, the node is removed). It is bounded by --timeout only per call.
func (a *app) waitPlacement(c *client.Client, id string, leaving bool) error {
	last := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		st, err := c.Status(ctx, &taskstorepb.StatusRequest{})
		cancel()
		if err != nil {
			return err
		}
		settled, what := client.PlacementSettled(st)
		var node *taskstorepb.NodeStatus
		for _, n := range st.Nodes {
			if n.Id == id {
				node = n
			}
		}
		done := settled
		if leaving {
			done = done && (node == nil || node.State == "removed")
		} else {
			// Joining: done once the node holds its share of the replicas.
			total, members := 0, 0
			for _, s := range st.Shards {
				total += len(s.Replicas)
			}
			for _, n := range st.Nodes {
				if n.State == "member" {
					members++
				}
			}
			done = done && node != nil && members > 0 && len(node.Shards) >= total/members
		}
		msg := what
		if node != nil {
			msg = fmt.Sprintf("%s: %s, %d replica(s) placed", id, node.State, len(node.Shards))
			if what != "" {
				msg += "; " + what
			}
		}
		if msg != last {
			fmt.Fprintln(a.stdout, msg)
			last = msg
		}
		if done {
			fmt.Fprintln(a.stdout, "placement settled")
			return nil
		}
		time.Sleep(time.Second)
	}
}
