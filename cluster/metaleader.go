package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// metaLeadership is whether this node leads the meta group and may change
// the map: ready after the barrier of its term has applied, so its map holds
// every change an earlier leader committed.
type metaLeadership struct {
	// raft is the meta group's, set when the group opens (startGroups).
	raft         *raft.Raft
	applyTimeout time.Duration
	ready        atomic.Bool
}

// watch keeps ready until stop closes.
func (l *metaLeadership) watch(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case leader := <-l.raft.LeaderCh():
			l.ready.Store(false)
			if !leader {
				continue
			}
			err, stopped := awaitFuture(context.Background(), stop, l.raft.Barrier(l.applyTimeout))
			if stopped != nil {
				return
			}
			if err == nil {
				l.ready.Store(true)
			}
		}
	}
}

// propose commits a meta command; only on the meta leader.
func (l *metaLeadership) propose(ctx context.Context, cmd *metapb.Command) error {
	if !l.ready.Load() {
		return ErrNotLeader
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		return err
	}
	return waitFuture(ctx, l.raft.Apply(data, l.applyTimeout))
}

// notLeader names the meta group's leader, as this node knows it.
func (l *metaLeadership) notLeader() error {
	addr, id := l.raft.LeaderWithID()
	return &NotLeaderError{Shard: MetaGroupID, LeaderID: string(id), LeaderAddress: string(addr)}
}

// metaChores are the meta leader's loops, each until stop closes: write
// the initial map and record the addresses nodes gossip (record), and place
// replicas (place, control.Controller.PlaceOnce).
type metaChores struct {
	cfg        Config
	log        *slog.Logger
	stop       <-chan struct{}
	lead       *metaLeadership
	clusterMap func() *metapb.ClusterMap
	gossip     *gossip
	ctl        *control.Controller
}

// record writes the initial map, and records the addresses nodes gossip.
func (c *metaChores) record() {
	for sleepUntil(c.stop, 500*time.Millisecond) {
		if !c.lead.ready.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Tuning.ApplyTimeout)
		cm := c.clusterMap()
		if cm.ClusterId == "" {
			if init := initialMap(c.cfg); init != nil {
				if err := c.lead.propose(ctx, &metapb.Command{Op: metapb.Op_OP_INIT, Init: init}); err != nil {
					c.log.Warn("write initial cluster map", "err", err)
				} else {
					c.log.Info("cluster map initialised", "cluster", init.ClusterId, "shards", len(init.Shards), "replicas", init.ReplicationFactor)
				}
			}
		} else {
			for _, m := range c.gossip.snapshot() {
				have := control.FindNode(cm, m.ID)
				if have == nil || m.Health != HealthAlive {
					continue
				}
				if have.GossipAddress != m.GossipAddress || have.HttpAddress != m.Meta.HTTPAddress || (m.Meta.Address != "" && have.Address != m.Meta.Address) {
					up := &metapb.Node{Id: m.ID, Address: m.Meta.Address, GossipAddress: m.GossipAddress, HttpAddress: m.Meta.HTTPAddress}
					if err := c.lead.propose(ctx, &metapb.Command{Op: metapb.Op_OP_UPDATE_NODE, Node: up}); err != nil {
						c.log.Warn("record node addresses", "peer", m.ID, "err", err)
					}
				}
			}
		}
		cancel()
	}
}

// place is the meta leader's placement loop.
func (c *metaChores) place() {
	for sleepUntil(c.stop, max(c.cfg.Tuning.HeartbeatTimeout, time.Second)) {
		if !c.lead.ready.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Tuning.ApplyTimeout)
		if err := c.ctl.PlaceOnce(ctx); err != nil && !errors.Is(err, ErrNotLeader) {
			c.log.Warn("placement", "err", err)
		}
		cancel()
	}
}
