package cluster

import (
	"context"
	"time"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Retention: a queue policy's retain deletes the queue's tasks older than
// that since their insert. The state machine does it in OP_EXPIRE steps of
// at most retainVisit visited tasks each, so that a huge expiry never
// makes one long entry; the leader proposes them from a cursor, at most
// retainSteps per queue every retainEvery, and starts the walk over once
// it reached the end.
const (
	retainEvery = time.Second
	retainVisit = 1024
	retainSteps = 32
)

// ExpireRetained proposes the next retention steps of each queue of the
// shard with a retain, when this replica leads, and returns how many tasks
// they deleted.
func (s *Shard) ExpireRetained(ctx context.Context) (uint64, error) {
	if !s.IsLeader() {
		s.retainAt = nil // a new leader walks from the start
		return 0, nil
	}
	queues := s.machine.Retained()
	if len(queues) == 0 {
		s.retainAt = nil
		return 0, nil
	}
	if s.retainAt == nil {
		s.retainAt = map[string]*fsmpb.ExpireResult{}
	}
	for q := range s.retainAt {
		if _, ok := queues[q]; !ok {
			delete(s.retainAt, q)
		}
	}
	var deleted uint64
	for q := range queues {
		for range retainSteps {
			e := &fsmpb.Expire{Queue: q, Visit: retainVisit}
			if at := s.retainAt[q]; at != nil {
				e.Priority, e.At, e.Id = at.Priority, at.At, at.Id
			}
			res, err := s.Propose(ctx, &fsmpb.Command{Op: fsmpb.Op_OP_EXPIRE, Expire: e})
			if err != nil {
				return deleted, err
			}
			r := res.GetExpire()
			deleted += r.GetDeleted()
			if r == nil || r.Done {
				delete(s.retainAt, q)
				break
			}
			s.retainAt[q] = r
		}
	}
	if deleted > 0 {
		s.log.Debug("retention deleted tasks", "deleted", deleted)
	}
	return deleted, nil
}
