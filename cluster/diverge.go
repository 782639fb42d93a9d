package cluster

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Run-time divergence detection (cluster/DESIGN.md "Replicas
// compare state digests"). Every replica's machine checkpoints its state at
// indexes the log alone decides (fsm.Checkpoint). Every node periodically
// fetches the checkpoints of the voters of each shard it hosts and judges
// only itself: where a strict majority of the voters agree on a digest and
// its own differs, its replica diverged, and it stops serving that shard for
// good (a marker file keeps it stopped across restarts) until an operator
// rebuilds it from the healthy replicas (RebuildReplica).

// ErrDiverged: the local replica of a shard stopped because its state
// differs from the majority's.
var ErrDiverged = errors.New("replica diverged")

// ForwardedKey is the gRPC metadata key that marks an admin call one node
// sent to another on a caller's behalf: it is forwarded at most once, and a
// RebuildReplica with wipe is accepted only with it.
const ForwardedKey = "x-taskstore-forwarded"

// replicaCheckInterval is how often a node compares its replicas'
// checkpoints with the other voters'.
const replicaCheckInterval = 30 * time.Second

// divergedMarker is the file in a shard's directory that keeps a diverged
// replica stopped across restarts. Its content is a divergenceRecord.
const divergedMarker = "DIVERGED"

// divergenceRecord is what a replica found when it stopped; it is the
// marker's JSON and what Status reports.
type divergenceRecord struct {
	Shard          uint32    `json:"shard"`
	Index          uint64    `json:"index"`
	Digest         string    `json:"digest"`
	MajorityDigest string    `json:"majority_digest"`
	Majority       []string  `json:"majority"`
	Detected       time.Time `json:"detected"`
	// Damaged: the replica's files would not open (why). Kept in memory
	// only: a restart finds the damage again.
	Damaged string `json:"damaged,omitempty"`
}

func (d *divergenceRecord) toProto() *taskstorepb.Divergence {
	own, _ := hex.DecodeString(d.Digest)
	maj, _ := hex.DecodeString(d.MajorityDigest)
	return &taskstorepb.Divergence{Index: d.Index, Digest: own, MajorityDigest: maj,
		Majority: slices.Clone(d.Majority), Detected: timestamppb.New(d.Detected), Damaged: d.Damaged}
}

// readDivergedMarker returns the marker of a shard directory, nil if there
// is none. An unreadable marker still counts: the replica stays stopped.
func readDivergedMarker(dir string, id uint32) (*divergenceRecord, error) {
	data, err := os.ReadFile(filepath.Join(dir, divergedMarker))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	rec := &divergenceRecord{Shard: id}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, rec); err != nil {
		return &divergenceRecord{Shard: id}, fmt.Errorf("%s: %w", filepath.Join(dir, divergedMarker), err)
	}
	return rec, nil
}

// writeDivergedMarker writes the marker durably (file and directory
// fsynced): a crash right after must not bring the replica back.
func writeDivergedMarker(dir string, rec *divergenceRecord) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, divergedMarker)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Diverged returns what the local replica of a shard found when it stopped
// because its state diverged, or nil.
func (n *Node) Diverged(shard uint32) *taskstorepb.Divergence {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if d := n.diverged[shard]; d != nil {
		return d.toProto()
	}
	return nil
}

// divergedError points a request for node self's diverged replica of shard
// id at another replica of map cm, never at self.
func divergedError(cm *metapb.ClusterMap, self string, id uint32) error {
	// The reason is given even when no other replica is known yet (right
	// after a restart, before the cluster map is loaded).
	e := &NotLeaderError{Shard: id, Why: "this node's replica diverged and is stopped (taskctl shard rebuild)"}
	if sh := control.FindShard(cm, id); sh != nil {
		for _, r := range sh.Replicas {
			if node := control.FindNode(cm, r); node != nil && r != self {
				e.LeaderID, e.LeaderAddress, e.Replica = node.Id, node.Address, true
				break
			}
		}
	}
	return e
}

// checkpointsOf lists a replica's checkpoints for Status.
func checkpointsOf(m *fsm.Machine) []*taskstorepb.Checkpoint {
	cps := m.Checkpoints()
	out := make([]*taskstorepb.Checkpoint, len(cps))
	for i, cp := range cps {
		out[i] = &taskstorepb.Checkpoint{Index: cp.Index, Digest: cp.Digest[:], OnDisk: cp.OnDisk}
	}
	return out
}

// checkReplicasEvery calls check (Node.CheckReplicas) every
// replicaCheckInterval until stop closes.
func checkReplicasEvery(stop <-chan struct{}, check func(context.Context)) {
	for sleepUntil(stop, replicaCheckInterval) {
		ctx, cancel := context.WithTimeout(context.Background(), replicaCheckInterval/2)
		check(ctx)
		cancel()
	}
}

// CheckReplicas compares the checkpoints of every local replica with the
// other voters' once (it runs every 30 s; tests call it directly). A local
// replica found diverged is stopped (see stopDiverged).
func (n *Node) CheckReplicas(ctx context.Context) {
	shards := n.LocalShards()
	if len(shards) == 0 {
		return
	}
	// One report per peer covers all its shards.
	reports := map[string]*peerpb.NodeReport{}
	addrs := map[string]string{}
	for _, s := range shards {
		for _, srv := range s.voters() {
			if string(srv.ID) != n.cfg.ID {
				addrs[string(srv.ID)] = string(srv.Address)
			}
		}
	}
	type answer struct {
		id string
		r  *peerpb.NodeReport
	}
	ch := make(chan answer, len(addrs))
	for id, addr := range addrs {
		go func() {
			ch <- answer{id, n.peerc.report(ctx, addr)}
		}()
	}
	for range addrs {
		a := <-ch
		if a.r != nil {
			reports[a.id] = a.r
		}
	}
	for _, s := range shards {
		voters := s.voters()
		if !slices.ContainsFunc(voters, func(srv raft.Server) bool { return string(srv.ID) == n.cfg.ID }) {
			continue // a non-voter catching up judges nothing
		}
		var ids []string
		own, onDisk := peerCheckpoints(s.machine)
		seen := map[string][]*peerpb.Checkpoint{n.cfg.ID: own}
		for _, srv := range voters {
			id := string(srv.ID)
			ids = append(ids, id)
			if id == n.cfg.ID || reports[id] == nil {
				continue
			}
			if rep := replicaOf(reports[id], s.id); rep != nil && reports[id].Node == id && !rep.Diverged {
				// Digests of the same kind as this replica's only: a
				// replica in memory and one on disk digest the same
				// state differently.
				seen[id] = rep.Checkpoints
				if onDisk {
					seen[id] = rep.DiskCheckpoints
				}
			}
		}
		v := judge(n.cfg.ID, ids, seen)
		n.act(s, v)
	}
}

// voters is the shard's current Raft voters (nil if unknown).
func (s *Shard) voters() []raft.Server {
	f := s.g.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var out []raft.Server
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			out = append(out, srv)
		}
	}
	return out
}

// verdict is one judgement of a replica against its group's voters.
type verdict struct {
	index uint64 // the checkpoint judged; 0: nothing to compare yet
	// diverged: a strict majority of the voters agree on majority and this
	// replica's digest differs.
	diverged bool
	own      []byte
	majority []byte
	agree    []string // the voters that hold majority
	// disagree describes a checkpoint where no digest has a strict
	// majority: which replica is wrong is unknown, so nothing stops.
	disagree string
}

// judge compares self's checkpoints with the other voters'. It looks at the
// newest index that self and a majority of the voters (counting self) have
// checkpointed: a strict majority of all voters agreeing on a digest other
// than self's means self diverged; no digest with a strict majority means
// the replicas disagree. Only self is ever judged: each node stops only its
// own replica, so a wrong verdict elsewhere cannot take a healthy one down.
func judge(self string, voters []string, seen map[string][]*peerpb.Checkpoint) verdict {
	quorum := len(voters)/2 + 1
	digests := map[uint64]map[string][]byte{} // index -> voter -> digest
	for _, id := range voters {
		for _, cp := range seen[id] {
			if digests[cp.Index] == nil {
				digests[cp.Index] = map[string][]byte{}
			}
			digests[cp.Index][id] = cp.Digest
		}
	}
	var indexes []uint64
	for idx, by := range digests {
		if _, ok := by[self]; ok && len(by) >= quorum {
			indexes = append(indexes, idx)
		}
	}
	if len(indexes) == 0 {
		return verdict{}
	}
	idx := slices.Max(indexes)
	by := digests[idx]
	counts := map[string][]string{} // digest -> voters holding it
	for id, d := range by {
		counts[string(d)] = append(counts[string(d)], id)
	}
	v := verdict{index: idx, own: by[self]}
	for d, ids := range counts {
		if len(ids) >= quorum {
			slices.Sort(ids)
			v.majority, v.agree = []byte(d), ids
			v.diverged = d != string(by[self])
			return v
		}
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s=%x", id, by[id][:min(8, len(by[id]))]))
	}
	v.disagree = fmt.Sprintf("at index %d no digest is held by a majority of %d voters: %s", idx, len(voters), strings.Join(parts, " "))
	return v
}

// act applies a verdict to a local replica.
func (n *Node) act(s *Shard, v verdict) {
	if v.index == 0 {
		return
	}
	n.mu.Lock()
	if v.disagree != "" {
		if n.disagree[s.id] != v.disagree {
			n.log.Error("replicas of a shard disagree and no majority holds one state: a replica may have diverged; compare them (taskctl status) and rebuild the wrong one",
				"shard", s.id, "detail", v.disagree)
		}
		n.disagree[s.id] = v.disagree
	} else {
		delete(n.disagree, s.id)
	}
	n.mu.Unlock()
	if v.diverged {
		n.stopDiverged(s, &divergenceRecord{Shard: s.id, Index: v.index, Digest: hex.EncodeToString(v.own),
			MajorityDigest: hex.EncodeToString(v.majority), Majority: v.agree, Detected: time.Now().UTC()})
	}
}

// stopDiverged takes a diverged replica out of service for good: it
// records the marker, stops answering for the shard (reads, stale reads and
// writes are pointed at another replica), hands off leadership and shuts
// the shard's Raft group down, so it neither votes nor replicates. Its files
// stay on disk for forensics until RebuildReplica replaces them.
func (n *Node) stopDiverged(s *Shard, rec *divergenceRecord) {
	n.mu.Lock()
	if n.closed || n.shards[s.id] != s {
		n.mu.Unlock()
		return // closed meanwhile (node stopping, replica retired)
	}
	delete(n.shards, s.id)
	n.localShards.Store(int32(len(n.shards)))
	n.diverged[s.id] = rec
	delete(n.disagree, s.id)
	n.mu.Unlock()
	n.log.Error("replica diverged from the majority of its shard: it stops serving the shard and stays stopped (restarts included) until rebuilt with `taskctl shard rebuild`",
		"shard", s.id, "index", rec.Index, "digest", rec.Digest, "majority_digest", rec.MajorityDigest,
		"majority", strings.Join(rec.Majority, ","), "dir", s.g.dir)
	if err := writeDivergedMarker(s.g.dir, rec); err != nil {
		n.log.Error("write divergence marker: a restart would serve the diverged replica again", "shard", s.id, "err", err)
	}
	if s.g.raft.State() == raft.Leader {
		ctx, cancel := context.WithTimeout(context.Background(), 2*n.cfg.Tuning.ElectionTimeout+time.Second)
		if err := waitFuture(ctx, s.g.raft.LeadershipTransfer()); err != nil {
			n.log.Warn("hand off leadership of the diverged replica", "shard", s.id, "err", err)
		}
		cancel()
	}
	if err := s.close(); err != nil {
		n.log.Warn("close diverged replica", "shard", s.id, "err", err)
	}
}

// dueEvery is how often a leader looks for tasks whose delay or lease has
// run out on a shard nothing writes to.
const dueEvery = 250 * time.Millisecond

// TickIfDue proposes an OP_TICK when this replica leads and a task of the
// shard came due by the leader's time after the machine's clock; it
// reports whether it did.
func (s *Shard) TickIfDue(ctx context.Context) (bool, error) {
	if !s.IsLeader() {
		return false, nil
	}
	at, ok := s.machine.NextDue()
	if !ok || at > s.Now() {
		return false, nil
	}
	if _, err := s.Propose(ctx, &fsmpb.Command{Op: fsmpb.Op_OP_TICK}); err != nil {
		return false, err
	}
	return true, nil
}

// TickIfIdle proposes an OP_TICK when this replica leads and the machine's
// clock is at least idle behind the leader's time; it reports whether it
// did. A tick only moves the clock, so it is safe to repeat.
func (s *Shard) TickIfIdle(ctx context.Context, idle time.Duration) (bool, error) {
	if !s.IsLeader() || s.clock().UnixNano()-s.machine.Clock() < int64(idle) {
		return false, nil
	}
	if _, err := s.Propose(ctx, &fsmpb.Command{Op: fsmpb.Op_OP_TICK}); err != nil {
		return false, err
	}
	return true, nil
}

// RebuildReplica replaces node's diverged replica of a shard with a copy of
// the healthy replicas. It runs on the shard's leader (elsewhere it returns
// a *NotLeaderError naming the leader when known): remove the replica from
// the Raft group, then tell its node to delete its copy and start empty.
// Placement then adds it back as a non-voter, which catches up (by snapshot
// when the log was compacted) and is promoted. Membership first, files
// second: a voter that lost its files could vote twice in one term.
func (n *Node) RebuildReplica(ctx context.Context, shard uint32, node string) error {
	cm := n.meta.Map()
	sh := control.FindShard(cm, shard)
	if sh == nil {
		n.mu.RLock()
		local := n.shards[shard] != nil || n.diverged[shard] != nil
		n.mu.RUnlock()
		if local || len(cm.Shards) == 0 {
			// A node that restarted holds the shard but has not yet
			// replayed the map that names it.
			return fmt.Errorf("%w: this node has not caught up with the map yet (shard %d)", ErrNotReady, shard)
		}
		return fmt.Errorf("%w: %d", ErrUnknownShard, shard)
	}
	if !slices.Contains(sh.Replicas, node) {
		return fmt.Errorf("%w: node %s holds no replica of shard %d", ErrInvalidRequest, node, shard)
	}
	target := control.FindNode(cm, node)
	if target == nil || target.Address == "" {
		return fmt.Errorf("%w: node %s has no address in the map", ErrInvalidRequest, node)
	}
	s := n.Shard(shard)
	if s == nil || !s.IsLeader() {
		return shardLeaderError(ctx, n.peerc, n.meta.Map(), n.cfg.ID, shard, s)
	}
	if node == n.cfg.ID {
		return fmt.Errorf("%w: the leader of shard %d is %s itself, so it is not diverged", ErrRefused, shard, node)
	}
	conn, err := n.peers.get(target.Address)
	if err != nil {
		return err
	}
	// Refuse a healthy replica: rebuilding one costs a copy of the shard
	// and, while it catches up, a vote.
	rep := n.peerc.report(ctx, target.Address)
	if rep == nil {
		return fmt.Errorf("%w: node %s does not answer; rebuild it when it is up", ErrRefused, node)
	}
	if r := replicaOf(rep, shard); rep.Node != node || r == nil || !r.Diverged {
		return fmt.Errorf("%w: %s's replica of shard %d is not diverged", ErrRefused, node, shard)
	}
	f := s.g.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) != node {
			continue
		}
		n.log.Warn("rebuild: removing diverged replica from the shard's group", "shard", shard, "peer", node)
		if err := changeConfig(ctx, s.g.raft, func(prev uint64) raft.IndexFuture {
			return s.g.raft.RemoveServer(srv.ID, prev, 0)
		}); err != nil {
			return fmt.Errorf("remove %s from shard %d: %w", node, shard, err)
		}
	}
	if err := wipeRemote(ctx, conn, shard, node); err != nil {
		return fmt.Errorf("tell %s to delete its copy of shard %d: %w", node, shard, err)
	}
	n.log.Warn("rebuild: diverged replica deleted; it rejoins as a non-voter and is promoted once caught up", "shard", shard, "peer", node)
	return nil
}

// shardLeaderError names the shard's leader for a request only it can do,
// s being node self's replica of it (nil: none here); the replicas of map
// cm are asked through pc.
func shardLeaderError(ctx context.Context, pc *peerClient, cm *metapb.ClusterMap, self string, shard uint32, s *Shard) error {
	if s != nil {
		return s.notLeader()
	}
	// Not hosted here (or diverged): ask the replicas who leads.
	if sh := control.FindShard(cm, shard); sh != nil {
		for _, r := range sh.Replicas {
			node := control.FindNode(cm, r)
			if r == self || node == nil {
				continue
			}
			if rep := replicaOf(pc.report(ctx, node.Address), shard); rep != nil && rep.Leader != "" {
				if l := control.FindNode(cm, rep.Leader); l != nil && l.Id != self {
					return &NotLeaderError{Shard: shard, LeaderID: l.Id, LeaderAddress: l.Address}
				}
			}
		}
	}
	return &NotLeaderError{Shard: shard}
}

// WipeReplica deletes this node's diverged replica of a shard and starts
// an empty one in its place, which waits for the leader to add it. Only the
// shard's leader calls it, after removing the replica from the group
// (RebuildReplica).
func (n *Node) WipeReplica(shard uint32) error {
	// Claim the record under the lock, so two wipes cannot both run.
	n.mu.Lock()
	rec := n.diverged[shard]
	delete(n.diverged, shard)
	n.mu.Unlock()
	if rec == nil {
		return fmt.Errorf("%w: this node's replica of shard %d is not diverged", ErrRefused, shard)
	}
	dir := groupDir(n.cfg.DataDir, shard)
	// The state first: without the group's files, a crash before the
	// drop would have the next start drop it anyway (newMachine).
	if err := n.state.drop(shard); err != nil {
		n.mu.Lock()
		n.diverged[shard] = rec
		n.mu.Unlock()
		return fmt.Errorf("delete the diverged replica's state of shard %d: %w", shard, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		n.mu.Lock()
		n.diverged[shard] = rec // still stopped: the marker may be left
		n.mu.Unlock()
		return fmt.Errorf("delete %s: %w", dir, err)
	}
	if err := n.raftLog.Group(shard).Reset(); err != nil {
		return fmt.Errorf("drop the deleted replica's Raft log entries of shard %d: %w", shard, err)
	}
	n.log.Warn("diverged replica deleted; starting an empty one to be filled from the leader", "shard", shard, "dir", dir)
	if _, err := n.openShard(shard); err != nil {
		return fmt.Errorf("start empty replica of shard %d: %w", shard, err)
	}
	return nil
}
