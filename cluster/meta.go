package cluster

import (
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// MetaGroupID is the Raft group id of the meta group; shards are 1..N.
const MetaGroupID = 0

// Node membership states recorded in the cluster map.
const (
	NodeMember   = metapb.NodeState_NODE_MEMBER
	NodeDraining = metapb.NodeState_NODE_DRAINING
	NodeRemoved  = metapb.NodeState_NODE_REMOVED
)

// nodeStateNames are the names of the membership states, as the meta log
// wrote them before it had the enum (Node.state) and as the API shows them.
var nodeStateNames = map[metapb.NodeState]string{
	NodeMember:   control.StateName(NodeMember),
	NodeDraining: control.StateName(NodeDraining),
	NodeRemoved:  control.StateName(NodeRemoved),
}

// NodeStateName is the name of a membership state ("member", "draining",
// "removed"), or "" for none.
func NodeStateName(s metapb.NodeState) string { return nodeStateNames[s] }

// normalizeNode makes n.Membership decide: a node written before the enum
// has only the name, which is parsed; one written since gets the name for
// readers of the older version. An unknown name leaves the membership
// unspecified, and so does a state of a newer version (applyMeta ignores
// such a change on every replica alike).
func normalizeNode(n *metapb.Node) {
	if _, known := nodeStateNames[n.Membership]; !known {
		n.Membership = metapb.NodeState_NODE_STATE_UNSPECIFIED
	}
	if n.Membership == metapb.NodeState_NODE_STATE_UNSPECIFIED {
		for s, name := range nodeStateNames {
			if n.State == name {
				n.Membership = s
			}
		}
	}
	n.State = nodeStateNames[n.Membership]
}

// normalizeShard is control.NormalizeShard (the rule placement follows too).
func normalizeShard(sh *metapb.Shard) {
	control.NormalizeShard(sh)
}

// withState returns a node record (for a command) in membership state s.
func withState(n *metapb.Node, s metapb.NodeState) *metapb.Node {
	n.Membership, n.State = s, nodeStateNames[s]
	return n
}

// metaFSM is the meta group's state machine: the cluster map. Apply runs on
// raft's goroutine; Map may be called concurrently.
type metaFSM struct {
	mu      sync.RWMutex // guards cm and watches
	cm      *metapb.ClusterMap
	watches []chan struct{}
}

var _ raft.FSM = (*metaFSM)(nil)

func newMetaFSM() *metaFSM { return &metaFSM{cm: &metapb.ClusterMap{}} }

// Map returns a copy of the current cluster map (empty before OP_INIT).
func (f *metaFSM) Map() *metapb.ClusterMap {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return proto.Clone(f.cm).(*metapb.ClusterMap)
}

// ShardOf returns the shard of a consistency group in the current map (0
// before OP_INIT) without copying the map: every request asks, and a copy of
// the 1024-slot table per request showed in the nodes' allocation profile.
func (f *metaFSM) ShardOf(group string) uint32 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return shardOf(f.cm, group)
}

// SlotTable returns a copy of the map's slots (slot -> shard).
func (f *metaFSM) SlotTable() []uint32 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return slices.Clone(f.cm.Slots)
}

// Changed returns a channel closed at the next change of the map.
func (f *metaFSM) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.watches = append(f.watches, ch)
	return ch
}

func (f *metaFSM) Apply(l *raft.Log) interface{} {
	if l.Type != raft.LogCommand {
		return nil
	}
	var cmd metapb.Command
	if err := proto.Unmarshal(l.Data, &cmd); err != nil {
		panic(fmt.Sprintf("meta: undecodable log entry %d: %v", l.Index, err))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	changed := applyMeta(f.cm, &cmd)
	if changed {
		f.cm.Epoch = l.Index
		for _, ch := range f.watches {
			close(ch)
		}
		f.watches = nil
	}
	return changed
}

// applyMeta applies one command to the map and reports whether it changed.
func applyMeta(cm *metapb.ClusterMap, cmd *metapb.Command) bool {
	switch cmd.Op {
	case metapb.Op_OP_INIT:
		if cm.ClusterId != "" || cmd.Init == nil {
			return false
		}
		proto.Merge(cm, cmd.Init)
		for _, node := range cm.Nodes {
			normalizeNode(node)
		}
		for _, sh := range cm.Shards {
			normalizeShard(sh)
		}
		return true
	case metapb.Op_OP_UPDATE_NODE:
		n := cmd.Node
		if n == nil || n.Id == "" {
			return false
		}
		for _, have := range cm.Nodes {
			if have.Id == n.Id {
				if n.Address != "" {
					have.Address = n.Address
				}
				if n.GossipAddress != "" {
					have.GossipAddress = n.GossipAddress
				}
				if n.HttpAddress != "" {
					have.HttpAddress = n.HttpAddress
				}
				return true
			}
		}
		node := proto.Clone(n).(*metapb.Node)
		normalizeNode(node)
		if node.Membership == metapb.NodeState_NODE_STATE_UNSPECIFIED {
			withState(node, NodeMember)
		}
		cm.Nodes = append(cm.Nodes, node)
		return true
	case metapb.Op_OP_SET_NODE_STATE:
		if cmd.Node == nil {
			return false
		}
		want := proto.Clone(cmd.Node).(*metapb.Node)
		normalizeNode(want)
		if want.Membership == metapb.NodeState_NODE_STATE_UNSPECIFIED {
			return false // no state this version knows: the same on every replica
		}
		for _, have := range cm.Nodes {
			if have.Id == want.Id {
				withState(have, want.Membership)
				return true
			}
		}
		return false
	case metapb.Op_OP_SET_REPLICAS:
		if cmd.Shard == nil {
			return false
		}
		want := proto.Clone(cmd.Shard).(*metapb.Shard)
		normalizeShard(want)
		for _, s := range cm.Shards {
			if s.Id == want.Id {
				s.Replicas, s.PreferredLeader = want.Replicas, want.PreferredLeader
				return true
			}
		}
		want.InitialReplicas, want.Retiring = nil, false // only OP_ADD_SHARD sets them
		cm.Shards = append(cm.Shards, want)
		return true
	case metapb.Op_OP_MOVE_BEGIN, metapb.Op_OP_MOVE_FLIP, metapb.Op_OP_MOVE_ABORT, metapb.Op_OP_MOVE_END:
		return applyMove(cm, cmd)
	case metapb.Op_OP_ADD_SHARD, metapb.Op_OP_RETIRE_SHARD, metapb.Op_OP_DROP_SHARD:
		return applyShardOp(cm, cmd)
	default:
		// An op code from a newer version: ignoring it would let replicas
		// diverge from the ones that understand it.
		panic(fmt.Sprintf("meta: unknown op %d", cmd.Op))
	}
}

func (f *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	data, err := proto.Marshal(f.Map())
	if err != nil {
		return nil, err
	}
	return metaSnapshot(data), nil
}

func (f *metaFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		return fmt.Errorf("meta: read snapshot: %w", err)
	}
	var cm metapb.ClusterMap
	if err := proto.Unmarshal(data, &cm); err != nil {
		return fmt.Errorf("meta: decode snapshot: %w", err)
	}
	for _, node := range cm.Nodes {
		normalizeNode(node) // a snapshot from before the enum
	}
	for _, sh := range cm.Shards {
		normalizeShard(sh) // a snapshot from before preferred_leader
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cm = &cm
	for _, ch := range f.watches {
		close(ch)
	}
	f.watches = nil
	return nil
}

type metaSnapshot []byte

func (s metaSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (metaSnapshot) Release() {}

// Peer is a node named in --initial-cluster.
type Peer struct {
	ID      string
	Address string
}

// InitialMap computes the bootstrap cluster map. It is deterministic in its
// inputs, so every node started with the same --initial-cluster, --shards and
// --replicas bootstraps the same shard groups. Shard i (1-based) is placed on
// rf consecutive peers starting at peer (i-1) mod n, the first of them its
// preferred leader, which spreads replicas and preferred leaders evenly.
func InitialMap(clusterID string, peers []Peer, shards, rf int) *metapb.ClusterMap {
	if rf > len(peers) {
		rf = len(peers)
	}
	cm := &metapb.ClusterMap{ClusterId: clusterID, ReplicationFactor: uint32(rf)}
	for _, p := range peers {
		cm.Nodes = append(cm.Nodes, withState(&metapb.Node{Id: p.ID, Address: p.Address}, NodeMember))
	}
	for i := 0; i < shards; i++ {
		s := &metapb.Shard{Id: uint32(i + 1)}
		for j := 0; j < rf; j++ {
			s.Replicas = append(s.Replicas, peers[(i+j)%len(peers)].ID)
		}
		normalizeShard(s)
		cm.Shards = append(cm.Shards, s)
	}
	cm.Slots = make([]uint32, taskstorepb.DefaultSlots)
	for i := range cm.Slots {
		cm.Slots[i] = uint32(i%shards) + 1
	}
	return cm
}

// shardOf returns the shard that owns a consistency group under the map, or 0.
func shardOf(cm *metapb.ClusterMap, group string) uint32 {
	if len(cm.Slots) == 0 {
		return 0
	}
	return cm.Slots[taskstorepb.SlotOf(group, len(cm.Slots))]
}
