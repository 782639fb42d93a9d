package cluster

import (
	"context"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// removalCheckEvery is how often a node that may have been removed asks
// its peers whether it was.
const removalCheckEvery = 2 * time.Second

// Removed is closed once this node learns that it was removed from the
// cluster. taskstored then stops it and exits: a removed node serves
// nothing, and its data directory may be deleted.
func (n *Node) Removed() <-chan struct{} { return n.removed }

// removalWatcher finds out whether this node was removed, and then closes
// removed. The meta group records the removal only after the node has left
// the group, so the node's own map never shows it: once the map says it is
// draining, or the meta group has had no leader it can see, it asks the
// members how they see it.
type removalWatcher struct {
	self       string
	log        *slog.Logger
	stop       <-chan struct{}
	clusterMap func() *metapb.ClusterMap
	// metaRaft is the meta group's Raft, asked whether it sees a leader.
	metaRaft *raft.Raft
	peerc    *peerClient
	removed  chan struct{}
}

// run checks every removalCheckEvery until stop closes or the node learns
// it was removed.
func (w *removalWatcher) run() {
	for sleepUntil(w.stop, removalCheckEvery) {
		cm := w.clusterMap()
		me := control.FindNode(cm, w.self)
		if me == nil {
			continue // not added yet
		}
		removed := me.Membership == NodeRemoved
		if !removed && (me.Membership == NodeDraining || w.metaRaft.Leader() == "") {
			removed = w.peersSayRemoved()
		}
		if removed {
			w.log.Warn("this node was removed from the cluster: it stops now; its data directory may be deleted")
			close(w.removed)
			return
		}
	}
}

// peersSayRemoved asks the other members how they see this node.
func (w *removalWatcher) peersSayRemoved() bool {
	for _, node := range w.clusterMap().Nodes {
		if node.Id == w.self || node.Membership == NodeRemoved || node.Address == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r := w.peerc.report(ctx, node.Address)
		cancel()
		if state, ok := memberState(r, w.self); ok && state == NodeRemoved {
			return true
		}
	}
	return false
}
