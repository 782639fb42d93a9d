package cluster

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// watchMetaLeadership marks the meta group ready after its barrier.
func (n *Node) watchMetaLeadership() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case leader := <-n.metaGroup.raft.LeaderCh():
			n.metaReady.Store(false)
			if !leader {
				continue
			}
			err, stopped := awaitFuture(context.Background(), n.stop, n.metaGroup.raft.Barrier(n.cfg.Tuning.ApplyTimeout))
			if stopped != nil {
				return
			}
			if err == nil {
				n.metaReady.Store(true)
			}
		}
	}
}

// proposeMeta commits a meta command; only on the meta leader.
func (n *Node) proposeMeta(ctx context.Context, cmd *metapb.Command) error {
	if !n.metaReady.Load() {
		return ErrNotLeader
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		return err
	}
	return waitFuture(ctx, n.metaGroup.raft.Apply(data, n.cfg.Tuning.ApplyTimeout))
}

// runMetaLeader does the meta leader's chores: write the initial map, and
// record the addresses nodes gossip.
func (n *Node) runMetaLeader() {
	for sleepUntil(n.stop, 500*time.Millisecond) {
		if !n.metaReady.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Tuning.ApplyTimeout)
		cm := n.meta.Map()
		if cm.ClusterId == "" {
			if init := n.initialMap(); init != nil {
				if err := n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_INIT, Init: init}); err != nil {
					n.log.Warn("write initial cluster map", "err", err)
				} else {
					n.log.Info("cluster map initialised", "cluster", init.ClusterId, "shards", len(init.Shards), "replicas", init.ReplicationFactor)
				}
			}
		} else {
			for _, m := range n.gossip.snapshot() {
				have := control.FindNode(cm, m.ID)
				if have == nil || m.Health != HealthAlive {
					continue
				}
				if have.GossipAddress != m.GossipAddress || have.HttpAddress != m.Meta.HTTPAddress || (m.Meta.Address != "" && have.Address != m.Meta.Address) {
					up := &metapb.Node{Id: m.ID, Address: m.Meta.Address, GossipAddress: m.GossipAddress, HttpAddress: m.Meta.HTTPAddress}
					if err := n.proposeMeta(ctx, &metapb.Command{Op: metapb.Op_OP_UPDATE_NODE, Node: up}); err != nil {
						n.log.Warn("record node addresses", "peer", m.ID, "err", err)
					}
				}
			}
		}
		cancel()
	}
}
