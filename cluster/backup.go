package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/fsm"
)

// ShardCopy is a point-in-time copy of a shard's state machine for a
// backup: the state as of Index, which every write acknowledged before
// BackupShard was called is within. Stream writes it (fsm's snapshot
// stream, the format a replica catching up by snapshot receives) while
// the shard goes on applying; Release ends it.
type ShardCopy struct {
	Shard uint32
	Index uint64
	Tasks uint64
	// Took is how long the copy held the state machine: the only time
	// writers of the shard wait for the backup.
	Took time.Duration
	snap raft.FSMSnapshot
}

// BackupShard takes a copy of shard id's state on its leader, after a
// read barrier: it is a linearizable read, so it holds every write
// acknowledged before the call. The copy holds the state machine's lock
// only while it takes a view (the on-disk store: an engine snapshot; in
// memory: a copy-on-write clone of its trees, a step per queue); the
// stream is written from that view while writes go on.
func (n *Node) BackupShard(ctx context.Context, id uint32) (*ShardCopy, error) {
	if id == MetaGroupID {
		return nil, fmt.Errorf("%w: shard 0 is the cluster map (BackupMap)", ErrInvalidRequest)
	}
	s, err := n.ShardByID(id)
	if err != nil {
		return nil, err
	}
	if err := s.ReadBarrier(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	snap, err := s.machine.BackupSnapshot()
	took := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("shard %d: copy the state: %w", id, err)
	}
	index, tasks, ok := fsm.SnapshotInfo(snap)
	if !ok {
		snap.Release()
		return nil, fmt.Errorf("shard %d: the state machine gave no full snapshot", id)
	}
	return &ShardCopy{Shard: id, Index: index, Tasks: tasks, Took: took, snap: snap}, nil
}

// Stream writes the copy to w.
func (c *ShardCopy) Stream(w io.Writer) error {
	return c.snap.Persist(&writerSink{w: w})
}

// Release ends the copy's view of the state.
func (c *ShardCopy) Release() { c.snap.Release() }

// writerSink is a raft.SnapshotSink onto a writer the caller owns.
type writerSink struct {
	w         io.Writer
	cancelled bool
}

func (s *writerSink) Write(p []byte) (int, error) { return s.w.Write(p) }
func (*writerSink) ID() string                    { return "backup" }
func (*writerSink) Close() error                  { return nil }
func (s *writerSink) Cancel() error               { s.cancelled = true; return nil }

// BackupMap returns the cluster map as the meta leader has it, after a
// leadership check: a map no change acknowledged before the call is
// missing from. Elsewhere it returns a NotLeaderError for the meta group.
func (n *Node) BackupMap(ctx context.Context) (*metapb.ClusterMap, error) {
	if !n.metaReady.Load() {
		return nil, n.metaNotLeader()
	}
	if err := waitFuture(ctx, n.metaGroup.raft.VerifyLeader()); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return nil, n.metaNotLeader()
		}
		return nil, err
	}
	return n.meta.Map(), nil
}
