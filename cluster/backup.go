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
// backup: the state as of Index, which holds every write acknowledged
// before the leader's fence (BackupFence) was taken. Stream writes it
// (fsm's snapshot stream, the format a replica catching up by snapshot
// receives) while the shard goes on applying; Release ends it.
type ShardCopy struct {
	Shard uint32
	Index uint64
	Tasks uint64
	// Took is how long the copy held the state machine: the only time
	// writers of the shard wait for the backup.
	Took time.Duration
	snap raft.FSMSnapshot
}

// notBackupShard refuses shard 0, the cluster map, which BackupMap copies.
func notBackupShard(id uint32) error {
	if id == MetaGroupID {
		return fmt.Errorf("%w: shard 0 is the cluster map (BackupMap)", ErrInvalidRequest)
	}
	return nil
}

func copyShard(s *Shard) (*ShardCopy, error) {
	start := time.Now()
	snap, err := s.machine.BackupSnapshot()
	took := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("shard %d: copy the state: %w", s.id, err)
	}
	index, tasks, ok := fsm.SnapshotInfo(snap)
	if !ok {
		snap.Release()
		return nil, fmt.Errorf("shard %d: the state machine gave no full snapshot", s.id)
	}
	return &ShardCopy{Shard: s.id, Index: index, Tasks: tasks, Took: took, snap: snap}, nil
}

// BackupReplica is a replica of a shard that may take a backup's copy.
type BackupReplica struct {
	ID, Address string
}

// BackupFence is where a backup's copy of shard id may come from. On the
// shard's leader, after a read barrier, it returns the index its state
// machine applied (every write acknowledged before the call is at or below
// it) and the shard's other voters: a follower that has applied the fence
// holds every such write too, and can take the copy instead of the leader
// (BackupShardAt). Elsewhere it returns a NotLeaderError.
func (n *Node) BackupFence(ctx context.Context, id uint32) (uint64, []BackupReplica, error) {
	if err := notBackupShard(id); err != nil {
		return 0, nil, err
	}
	s, err := n.ShardByID(id)
	if err != nil {
		return 0, nil, err
	}
	if err := s.ReadBarrier(ctx); err != nil {
		return 0, nil, err
	}
	// After a raft barrier every entry committed before it is applied
	// here, so the machine's applied index covers every write acknowledged
	// before the call. Not the commit index: a new leader's first entry
	// of its term and configuration entries never reach the machine, so
	// on a shard idle since its last election no replica's applied index
	// ever reached it until the next command (every replica refused the
	// copy as behind).
	err, stopped := awaitFuture(ctx, s.stop, s.g.raft.Barrier(0))
	if stopped != nil {
		return 0, nil, stopped
	}
	if err != nil {
		return 0, nil, s.notLeader()
	}
	fence := s.machine.AppliedIndex()
	f := s.g.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, nil, fmt.Errorf("shard %d: configuration: %w", id, err)
	}
	var followers []BackupReplica
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter && string(srv.ID) != n.ID() {
			followers = append(followers, BackupReplica{ID: string(srv.ID), Address: string(srv.Address)})
		}
	}
	return fence, followers, nil
}

// ErrCopyBehind: a replica asked for a backup's copy has not applied the
// backup's fence (BackupShardAt).
var ErrCopyBehind = errors.New("the replica has not applied the backup's index")

// backupPoll is how often BackupShardAt looks at the applied index.
const backupPoll = 2 * time.Millisecond

// BackupShardAt takes a copy of shard id on this replica, leader or not,
// once it has applied index min (a leader's BackupFence), waiting up to
// wait for it; a replica still behind then returns ErrCopyBehind, and the
// caller copies elsewhere. The copy is of a committed prefix of the log at
// or past min, so it holds every write the fence covers.
func (n *Node) BackupShardAt(ctx context.Context, id uint32, min uint64, wait time.Duration) (*ShardCopy, error) {
	if err := notBackupShard(id); err != nil {
		return nil, err
	}
	s, err := n.ShardByID(id)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for s.machine.AppliedIndex() < min {
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("shard %d on %s: applied %d, the backup needs %d: %w", id, n.ID(), s.machine.AppliedIndex(), min, ErrCopyBehind)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backupPoll):
		}
	}
	c, err := copyShard(s)
	if err == nil && c.Index < min {
		// The copy is of the state it read; applied only grows, but a
		// snapshot restore in between could not go back either: keep the
		// check, cheap, against a copy below the fence.
		c.Release()
		return nil, fmt.Errorf("shard %d on %s: copy at %d, the backup needs %d: %w", id, n.ID(), c.Index, min, ErrCopyBehind)
	}
	return c, err
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
	if _, err := n.metaLead.readIndex(ctx, n.stop); err != nil {
		return nil, err
	}
	return n.meta.Map(), nil
}
