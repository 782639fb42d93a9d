package cluster

import (
	"context"
	"time"

	"github.com/e1158ecb/taskstore/cluster/control"
)

// removalCheckEvery is how often a node that may have been removed asks
// its peers whether it was.
const removalCheckEvery = 2 * time.Second

// Removed is closed once this node learns that it was removed from the
// cluster. taskstored then stops it and exits: a removed node serves
// nothing, and its data directory may be deleted.
func (n *Node) Removed() <-chan struct{} { return n.removed }

// watchRemoval finds out whether this node was removed. The meta group
// records the removal only after the node has left the group, so the
// node's own map never shows it: once the map says it is draining, or the
// meta group has had no leader it can see, it asks the members how they
// see it.
func (n *Node) watchRemoval() {
	for n.sleep(removalCheckEvery) {
		cm := n.meta.Map()
		me := control.FindNode(cm, n.cfg.ID)
		if me == nil {
			continue // not added yet
		}
		removed := me.Membership == NodeRemoved
		if !removed && (me.Membership == NodeDraining || n.metaGroup.raft.Leader() == "") {
			removed = n.peersSayRemoved()
		}
		if removed {
			n.log.Warn("this node was removed from the cluster: it stops now; its data directory may be deleted")
			close(n.removed)
			return
		}
	}
}

// peersSayRemoved asks the other members how they see this node.
func (n *Node) peersSayRemoved() bool {
	for _, node := range n.meta.Map().Nodes {
		if node.Id == n.cfg.ID || node.Membership == NodeRemoved || node.Address == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r := n.askReport(ctx, node.Address)
		cancel()
		if state, ok := memberState(r, n.cfg.ID); ok && state == NodeRemoved {
			return true
		}
	}
	return false
}
