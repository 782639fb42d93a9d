package harness

import (
	"context"

	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// MetaLeader returns the index of the running node whose replica of the
// meta group is its Raft leader (the node that runs the slot mover and
// placement), or -1.
func (c *Cluster) MetaLeader() int {
	for i, n := range c.Nodes {
		if n.srv == nil {
			continue
		}
		st := n.srv.Node.Status(context.Background(), true)
		if m := st.GetMeta(); m != nil {
			for _, r := range m.ReplicaStatus {
				if r.Node == n.ID && r.Role == "leader" {
					return i
				}
			}
		}
	}
	return -1
}

// MetaMap returns the most current cluster map among the running nodes'
// copies (the highest epoch: the meta log index of its last change); nil
// when no node runs. It does not wait for followers to catch up.
func (c *Cluster) MetaMap() *metapb.ClusterMap {
	var best *metapb.ClusterMap
	for _, n := range c.Nodes {
		if n.srv == nil {
			continue
		}
		if cm := n.srv.Node.Map(); best == nil || cm.Epoch > best.Epoch {
			best = cm
		}
	}
	return best
}

// SlotStates returns the slots node i's replica of shard does not serve
// (fsm.Machine.SlotStates), by slot; false when the node does not run the
// shard.
func (c *Cluster) SlotStates(i int, shard uint32) ([]*fsmpb.SlotState, bool) {
	n := c.Nodes[i]
	if n.srv == nil {
		return nil, false
	}
	s := n.srv.Node.Shard(shard)
	if s == nil {
		return nil, false
	}
	return s.Machine().SlotStates(), true
}

// SlotTasks returns how many tasks node i's replica of shard holds in each
// slot of a table of slots (fsm.Machine.SlotTasks); false when the node
// does not run the shard.
func (c *Cluster) SlotTasks(i int, shard uint32, slots int) (map[uint32]int, bool) {
	n := c.Nodes[i]
	if n.srv == nil {
		return nil, false
	}
	s := n.srv.Node.Shard(shard)
	if s == nil {
		return nil, false
	}
	return s.Machine().SlotTasks(uint32(slots)), true
}
