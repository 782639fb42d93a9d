package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/hashicorp/raft"
)

// metaCatchUp fences the cluster map a node serves after its start. Raft
// restores the meta group from its snapshot and applies the log past it
// only once the group's leader has told the node the commit index, so
// until then the node's map may lack changes made since the snapshot (an
// added shard, a moved slot): a client routed by it would miss them,
// silently. The node serves routing, and reports ready, only once it has
// applied the meta group's commit index as the leader answered it after
// the start (MetaReadIndex, a read index).
type metaCatchUp struct {
	done chan struct{} // closed once caught up

	mu  sync.Mutex
	why error // why not yet, for the error callers get
}

func newMetaCatchUp() *metaCatchUp {
	return &metaCatchUp{done: make(chan struct{}), why: errors.New("not asked the meta group yet")}
}

func (m *metaCatchUp) setWhy(err error) {
	m.mu.Lock()
	m.why = err
	m.mu.Unlock()
}

func (m *metaCatchUp) reason() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.why
}

// catchUpMeta runs until this node's map has caught up, or the node stops.
func (n *Node) catchUpMeta() {
	for {
		err := n.tryCatchUpMeta()
		if err == nil {
			n.log.Info("cluster map caught up with the meta group", "applied", n.metaGroup.raft.AppliedIndex())
			close(n.metaCaught.done)
			return
		}
		n.metaCaught.setWhy(err)
		n.log.Debug("cluster map not caught up yet", "err", err)
		if !sleepUntil(n.stop, 100*time.Millisecond) {
			return
		}
	}
}

// tryCatchUpMeta asks the meta leader for its read index and waits, for a
// while, until the local meta group has applied it.
func (n *Node) tryCatchUpMeta() error {
	if n.metaLead.ready.Load() {
		return nil // leads, and its term's barrier applied every earlier commit
	}
	r := n.metaGroup.raft
	addr, id := r.LeaderWithID()
	if addr == "" {
		return errors.New("no leader of the meta group known (a majority of its members may be down or unreachable)")
	}
	if string(id) == n.cfg.ID {
		return errors.New("elected meta leader, its term's barrier has not applied yet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	index, err := n.peerc.metaReadIndex(ctx, string(addr))
	if status.Code(err) == codes.Unimplemented {
		// An older leader (mid-upgrade): serve the map as that version did.
		n.log.Warn("the meta leader does not answer MetaReadIndex: the cluster map is served without waiting to catch up", "leader", id)
		return nil
	}
	if err != nil {
		return fmt.Errorf("ask the meta leader %s for its commit index: %w", id, err)
	}
	if err := waitApplied(ctx, n.stop, r.AppliedIndex, index); err != nil {
		if errors.Is(err, ErrShutdown) {
			return err
		}
		return fmt.Errorf("applied meta entry %d of the %d the meta leader %s committed", r.AppliedIndex(), index, id)
	}
	return nil
}

// waitApplied waits until applied() reaches index, or ctx ends or stop
// closes (ErrShutdown). hashicorp/raft tells no one when it applied an
// index, so it looks every 10 ms.
func waitApplied(ctx context.Context, stop <-chan struct{}, applied func() uint64, index uint64) error {
	for applied() < index {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return ErrShutdown
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// metaReadIndex asks the node at addr for the meta group's read index.
func (c *peerClient) metaReadIndex(ctx context.Context, addr string) (uint64, error) {
	conn, err := c.pool.get(addr)
	if err != nil {
		return 0, err
	}
	res, err := peerpb.NewPeerClient(conn).MetaReadIndex(ctx, &peerpb.MetaReadIndexRequest{})
	return res.GetIndex(), err
}

func (p *peerServer) MetaReadIndex(ctx context.Context, _ *peerpb.MetaReadIndexRequest) (*peerpb.MetaReadIndexResponse, error) {
	index, err := p.n.metaLead.readIndex(ctx, p.n.stop)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &peerpb.MetaReadIndexResponse{Index: index}, nil
}

// readIndex is the meta group's commit index, once this node is its ready
// leader and a quorum still follows it: every entry committed before the
// call is at or below it. Elsewhere it returns a NotLeaderError for the
// meta group.
func (l *metaLeadership) readIndex(ctx context.Context, stop <-chan struct{}) (uint64, error) {
	if !l.ready.Load() {
		return 0, l.notLeader()
	}
	index := l.raft.CommitIndex()
	err, stopped := awaitFuture(ctx, stop, l.raft.VerifyLeader())
	switch {
	case stopped != nil:
		return 0, stopped
	case errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost):
		return 0, l.notLeader()
	case err != nil:
		return 0, err
	}
	return index, nil
}

// MetaCaughtUp is nil once this node's cluster map has caught up with the
// meta group after the node's start, else why not (wrapping ErrNotReady).
func (n *Node) MetaCaughtUp() error {
	select {
	case <-n.metaCaught.done:
		return nil
	default:
		return n.notCaughtUp()
	}
}

func (n *Node) notCaughtUp() error {
	return fmt.Errorf("%w: node %s has not caught up with the meta group since its start, its copy may be stale: %v",
		ErrNotReady, n.cfg.ID, n.metaCaught.reason())
}

// AwaitMeta waits until this node's cluster map has caught up with the meta
// group after its start (MetaCaughtUp), for at most the apply timeout, and
// ends early enough before ctx's deadline that the caller gets the answer
// why not rather than a bare deadline.
func (n *Node) AwaitMeta(ctx context.Context) error {
	select {
	case <-n.metaCaught.done:
		return nil
	default:
	}
	wait := n.cfg.Tuning.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		wait = min(wait, left-min(left/5, 500*time.Millisecond))
	}
	t := time.NewTimer(max(wait, 0))
	defer t.Stop()
	select {
	case <-n.metaCaught.done:
		return nil
	case <-ctx.Done():
	case <-t.C:
	case <-n.stop:
		return ErrShutdown
	}
	return n.notCaughtUp()
}
