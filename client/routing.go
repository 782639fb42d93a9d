package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// errNoRoute: the routing table is not known yet (or names no shard for the
// group); retried like an unavailable cluster.
var errNoRoute = fmt.Errorf("no routing table: %w", ErrUnavailable)

// router holds the routing table: slot -> shard, and each shard's replicas
// and leader. Leader hints from NotLeader errors update it in place; a full
// refresh reads Admin.Routing from any node.
type router struct {
	c *Client

	mu    sync.RWMutex // guards table and stale
	table *table
	stale bool // refresh before the next routed call

	refreshMu  sync.Mutex    // guards inflight and refreshErr
	inflight   chan struct{} // closed when the running refresh ends
	refreshErr error         // the last refresh's error

	rotate atomic.Uint32 // where the next pass over addresses starts
}

type table struct {
	slots  []uint32
	shards map[uint32]*shardRoute
	ids    []uint32 // shard ids, ascending
	epoch  uint64
}

type shardRoute struct {
	id         uint32
	replicas   []*taskstorepb.Replica
	leaderID   string
	leaderAddr string
}

func (r *router) init(c *Client) { r.c = c }

// refresh reads the routing table from the first node that answers. Callers
// that arrive while a refresh runs share it; ctx bounds only the waiting.
func (r *router) refresh(ctx context.Context) error {
	r.refreshMu.Lock()
	ch := r.inflight
	if ch == nil {
		ch = make(chan struct{})
		r.inflight = ch
		go r.fetch(ch)
	}
	r.refreshMu.Unlock()
	select {
	case <-ch:
		r.refreshMu.Lock()
		defer r.refreshMu.Unlock()
		return r.refreshErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fetch runs one refresh and closes done. It is detached from the caller's
// context so that one impatient caller does not spoil it for the others;
// each address gets a short timeout.
func (r *router) fetch(done chan struct{}) {
	per := 2 * time.Second
	if t := r.c.opts.attemptTimeout; t > 0 && t < per {
		per = t
	}
	addrs := r.addresses()
	start := int(r.rotate.Add(1))
	var errs []error
	var got *taskstorepb.RoutingResponse
	for i := range addrs {
		addr := addrs[(start+i)%len(addrs)]
		cc, err := r.c.conn(addr)
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrClosed) {
				break
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), per)
		resp, err := taskstorepb.NewAdminClient(cc).Routing(ctx, &taskstorepb.RoutingRequest{})
		cancel()
		if err == nil && len(resp.Slots) > 0 {
			got = resp
			break
		}
		if err == nil {
			err = fmt.Errorf("empty routing table")
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, decode("Routing", addr, err)))
	}
	var err error
	if got != nil {
		r.apply(got)
	} else {
		err = fmt.Errorf("routing: no node answered: %w", errors.Join(errs...))
	}
	r.refreshMu.Lock()
	r.refreshErr = err
	r.inflight = nil
	r.refreshMu.Unlock()
	close(done)
}

// apply installs a routing response unless it is older than the table held.
// A leader the response does not know (the answering node hosts no replica
// of the shard) is kept from the old table while it is still a replica.
func (r *router) apply(resp *taskstorepb.RoutingResponse) {
	t := &table{slots: slices.Clone(resp.Slots), shards: make(map[uint32]*shardRoute), epoch: resp.Epoch}
	for _, s := range resp.Shards {
		t.shards[s.Id] = &shardRoute{id: s.Id, replicas: s.Replicas, leaderID: s.LeaderId, leaderAddr: s.LeaderAddress}
		t.ids = append(t.ids, s.Id)
	}
	slices.Sort(t.ids)
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.table; old != nil {
		if t.epoch < old.epoch {
			r.stale = false
			return
		}
		for id, s := range t.shards {
			if o := old.shards[id]; o != nil && s.leaderAddr == "" && o.leaderAddr != "" && isReplica(s, o.leaderAddr) {
				s.leaderID, s.leaderAddr = o.leaderID, o.leaderAddr
			}
		}
	}
	r.table = t
	r.stale = false
}

func isReplica(s *shardRoute, addr string) bool {
	for _, rep := range s.replicas {
		if rep.Address == addr {
			return true
		}
	}
	return false
}

// addresses lists every address worth asking: the seeds, then every replica
// the table knows, without repeats.
func (r *router) addresses() []string {
	out := slices.Clone(r.c.seeds)
	seen := make(map[string]bool)
	for _, a := range out {
		seen[a] = true
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.table != nil {
		for _, id := range r.table.ids {
			for _, rep := range r.table.shards[id].replicas {
				if rep.Address != "" && !seen[rep.Address] {
					seen[rep.Address] = true
					out = append(out, rep.Address)
				}
			}
		}
	}
	return out
}

// markStale makes the next routed call refresh the table first.
func (r *router) markStale() {
	r.mu.Lock()
	r.stale = true
	r.mu.Unlock()
}

// current returns the table, refreshing it first when it is missing or
// stale. A failed refresh keeps the old table.
func (r *router) current(ctx context.Context) (*table, error) {
	r.mu.RLock()
	t, stale := r.table, r.stale
	r.mu.RUnlock()
	if t != nil && !stale {
		return t, nil
	}
	err := r.refresh(ctx)
	r.mu.RLock()
	t = r.table
	r.mu.RUnlock()
	if t == nil {
		if err == nil {
			err = errNoRoute
		}
		return nil, fmt.Errorf("%w: %w", errNoRoute, err)
	}
	return t, nil
}

// shardOf returns the shard that owns a consistency group.
func (t *table) shardOf(group string) (uint32, bool) {
	if len(t.slots) == 0 {
		return 0, false
	}
	return t.slots[taskstorepb.SlotOf(group, len(t.slots))], true
}

// route returns the address to send a request for shard to: its leader, or,
// when the leader is unknown or is avoid (it just failed), one of its
// replicas chosen by attempt, which answers with a leader hint.
func (r *router) route(shard uint32, attempt int, avoid string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.table == nil {
		return "", false
	}
	s := r.table.shards[shard]
	if s == nil {
		return "", false
	}
	if s.leaderAddr != "" && s.leaderAddr != avoid {
		return s.leaderAddr, true
	}
	var cands []string
	for _, rep := range s.replicas {
		if rep.Address != "" && rep.Address != avoid {
			cands = append(cands, rep.Address)
		}
	}
	if len(cands) == 0 {
		if s.leaderAddr != "" {
			return s.leaderAddr, true
		}
		return "", false
	}
	return cands[attempt%len(cands)], true
}

// setLeader records a leader hint. Tables are shared by readers, so the
// shard's entry is replaced, not modified.
func (r *router) setLeader(shard uint32, id, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.table
	if t == nil {
		return
	}
	s := t.shards[shard]
	if s == nil {
		r.stale = true
		return
	}
	if s.leaderAddr == addr && s.leaderID == id {
		return
	}
	nt := *t
	nt.shards = make(map[uint32]*shardRoute, len(t.shards))
	for k, v := range t.shards {
		nt.shards[k] = v
	}
	ns := *s
	ns.leaderID, ns.leaderAddr = id, addr
	nt.shards[shard] = &ns
	r.table = &nt
	if !isReplica(&ns, addr) {
		r.stale = true // the hint names a node the table does not know
	}
}

// forgetLeader drops the leader of shard if it is addr, which said it is not
// the leader without knowing who is.
func (r *router) forgetLeader(shard uint32, addr string) {
	r.mu.RLock()
	var known bool
	if r.table != nil {
		s := r.table.shards[shard]
		known = s != nil && s.leaderAddr == addr
	}
	r.mu.RUnlock()
	if known {
		r.setLeader(shard, "", "")
	}
}

// shardIDs returns every shard id of the table (refreshing if needed).
func (r *router) shardIDs(ctx context.Context) ([]uint32, error) {
	t, err := r.current(ctx)
	if err != nil {
		return nil, err
	}
	return t.ids, nil
}
