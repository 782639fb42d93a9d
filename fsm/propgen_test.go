package fsm

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// gen produces random but plausible commands against the reference model's
// state, so that most references hit real tasks and versions.
type gen struct {
	r       *rand.Rand
	ref     *refModel
	nextID  int
	now     int64
	seqs    map[string]uint64
	queues  []string
	clients []string
}

func (g *gen) pick(xs []string) string { return xs[g.r.IntN(len(xs))] }

func (g *gen) someTask(group string) *fsmpb.Task {
	var ts []*fsmpb.Task
	for _, t := range g.ref.tasks {
		if refGroup(t.Queue) == group {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return nil
	}
	slices.SortFunc(ts, func(a, b *fsmpb.Task) int { return strings.Compare(a.Id, b.Id) })
	return ts[g.r.IntN(len(ts))]
}

func (g *gen) ref2(group string) (string, uint64) {
	t := g.someTask(group)
	switch n := g.r.IntN(10); {
	case t == nil || n == 0:
		return fmt.Sprintf("t%d", g.r.IntN(g.nextID+1)), uint64(1 + g.r.IntN(3))
	case n == 1:
		return t.Id, t.Version + 1
	case n == 2 && t.Version > 1:
		return t.Id, t.Version - 1
	}
	return t.Id, t.Version
}

func (g *gen) queueIn(group string) string {
	var qs []string
	for _, q := range g.queues {
		if refGroup(q) == group {
			qs = append(qs, q)
		}
	}
	return g.pick(qs)
}

func (g *gen) command(allowBatch bool) *fsmpb.Command {
	r := g.r
	switch r.IntN(10) {
	case 0:
		g.now -= int64(r.IntN(10)) // a leader whose clock is behind
	default:
		g.now += int64(r.IntN(15))
	}
	cmd := &fsmpb.Command{Now: g.now}
	if r.IntN(3) == 0 {
		c := g.pick(g.clients)
		cmd.ClientId = c
		switch r.IntN(6) {
		case 0: // retry
		case 1:
			if g.seqs[c] > 0 {
				cmd.Seq = g.seqs[c] - 1
				break
			}
			fallthrough
		default:
			g.seqs[c]++
		}
		if cmd.Seq == 0 {
			cmd.Seq = g.seqs[c]
		}
	}
	if r.IntN(60) == 0 {
		// The cluster raises the format once; a repeat or a lower one
		// changes nothing. Most runs reach the highest format early
		// enough to exercise it.
		return &fsmpb.Command{Op: fsmpb.Op_OP_SET_FORMAT, Now: g.now, Format: uint32(r.IntN(int(MaxFormat) + 1))}
	}
	group := g.pick([]string{"g", "g", "h"})
	if r.IntN(25) == 0 {
		cmd.Op, cmd.Limit = fsmpb.Op_OP_LIMIT, &fsmpb.QueueLimit{Queue: g.queueIn(group), MaxClaimed: uint32(r.IntN(3))}
		return cmd
	}
	if r.IntN(15) == 0 {
		// A retention step, from the start or from a task.
		e := &fsmpb.Expire{Queue: g.queueIn(group), Visit: uint32(r.IntN(4))}
		if t := g.someTask(group); t != nil && r.IntN(2) == 0 {
			e.Priority, e.At, e.Id = t.Priority, t.At, t.Id
		}
		cmd.Op, cmd.Expire = fsmpb.Op_OP_EXPIRE, e
		return cmd
	}
	if r.IntN(25) == 0 {
		// A delivery limit, sometimes refused (a dead-letter queue of
		// another group, or the queue itself), sometimes cleared.
		q := g.queueIn(group)
		p := &fsmpb.QueuePolicy{Queue: q, MaxClaims: uint32(r.IntN(3))}
		if r.IntN(2) == 0 {
			p.Retain = int64(r.IntN(300))
		}
		if r.IntN(2) == 0 {
			// A rate of one task every 1-5 ticks, bursts of 1-3 (a
			// burst without a rate, or none with one, is refused).
			p.RateInterval, p.Burst = int64(r.IntN(6)), uint32(r.IntN(4))
			p.BucketFullAt = int64(r.IntN(100)) // ignored
		}
		if p.MaxClaims > 0 {
			p.DeadLetter = g.pick([]string{group + "/dead", group + "/dead", g.queueIn(group), "g/a"})
		}
		cmd.Op, cmd.Policy = fsmpb.Op_OP_POLICY, p
		return cmd
	}
	if r.IntN(25) == 0 {
		cmd.Op, cmd.Pause = fsmpb.Op_OP_PAUSE, &fsmpb.Pause{Queue: g.queueIn(group), Paused: r.IntN(3) == 0}
		return cmd
	}
	if r.IntN(20) == 0 {
		// A schedule put or removed, sometimes through another queue of
		// the group than its own (refused).
		sc := &fsmpb.Schedule{Name: g.pick([]string{"s1", "s2"}), Queue: g.queueIn(group)}
		if r.IntN(4) == 0 {
			sc.Remove = true
		} else {
			sc.Every, sc.Next, sc.Value, sc.Priority = 10, g.now+int64(r.IntN(20)), []byte("tick"), int32(r.IntN(3))
			if old := g.ref.schedules[group+"\x00"+sc.Name]; old.GetLast() > 0 && r.IntN(2) == 0 {
				// Put again at a tick it fired already: that tick's task
				// must not be inserted twice.
				sc.Next = old.Last
			}
		}
		cmd.Op, cmd.Schedule = fsmpb.Op_OP_SCHEDULE, sc
		return cmd
	}
	if len(g.ref.schedules) > 0 && r.IntN(8) == 0 {
		// A leader fires a schedule's tick: the one it waits for, or a
		// stale one (another leader fired it already); the next tick
		// is after it, or not (refused).
		keys := slices.Sorted(maps.Keys(g.ref.schedules))
		s := g.ref.schedules[keys[r.IntN(len(keys))]]
		f := &fsmpb.Fire{Queue: s.Queue, Name: s.Name, Tick: s.Next, Next: s.Next + s.Every, Insert: r.IntN(4) != 0}
		switch r.IntN(8) {
		case 0:
			f.Tick-- // stale
		case 1:
			f.Next = f.Tick
		}
		return &fsmpb.Command{Op: fsmpb.Op_OP_FIRE, Now: g.now, Fire: f}
	}
	claimants := []string{"w1", "w2", ""}
	switch n := r.IntN(20); {
	case n < 9:
		m := &fsmpb.Modify{Group: group, Claimant: g.pick(claimants)}
		for range r.IntN(3) {
			g.nextID++
			id := fmt.Sprintf("t%d", g.nextID)
			if r.IntN(8) == 0 {
				id = fmt.Sprintf("t%d", r.IntN(g.nextID)) // maybe a duplicate
			}
			if r.IntN(8) == 0 {
				// The id of a task of the other group: a duplicate before
				// FormatGroupIDs, a task of its own after.
				if t := g.someTask(map[string]string{"g": "h", "h": "g"}[group]); t != nil {
					id = t.Id
				}
			}
			in := &fsmpb.Insert{Id: id, Queue: g.queueIn(group), Priority: int32(r.IntN(3)), Value: []byte(id)}
			if r.IntN(3) == 0 {
				in.Key = fmt.Sprintf("k%d", r.IntN(4))
				in.IfAbsent = r.IntN(2) == 0
				in.DedupWindow = int64(r.IntN(3) * 80)
			}
			if r.IntN(4) == 0 {
				in.At = g.now + int64(r.IntN(40)) - 10
				in.Held = m.Claimant != "" && r.IntN(2) == 0
			}
			m.Inserts = append(m.Inserts, in)
		}
		for range r.IntN(3) {
			id, v := g.ref2(group)
			c := &fsmpb.Change{Id: id, Version: v, KeepClaim: r.IntN(3) == 0}
			if r.IntN(3) == 0 {
				c.Queue = g.queueIn(group)
			}
			if r.IntN(3) == 0 {
				c.At = g.now + int64(r.IntN(40)) - 10
			}
			if r.IntN(3) == 0 {
				p := int32(r.IntN(3))
				c.Priority = &p
			}
			if r.IntN(4) == 0 {
				c.Value = []byte("changed")
			}
			if r.IntN(4) == 0 {
				a := uint32(r.IntN(5))
				e := "e"
				c.Attempt, c.Err = &a, &e
			}
			m.Changes = append(m.Changes, c)
		}
		for range r.IntN(2) {
			id, v := g.ref2(group)
			m.Deletes = append(m.Deletes, &fsmpb.Ref{Id: id, Version: v})
		}
		for range r.IntN(2) {
			id, v := g.ref2(group)
			m.Depends = append(m.Depends, &fsmpb.Ref{Id: id, Version: v})
		}
		cmd.Op, cmd.Modify = fsmpb.Op_OP_MODIFY, m
		if r.IntN(3) == 0 {
			// A commit that carries the next claim; now and then one that
			// names another group's queue (Validate refuses it; the
			// machine must too, claiming nothing and changing nothing).
			if m.Claimant == "" {
				m.Claimant = g.pick(claimants[:2])
			}
			qgroup := group
			if r.IntN(10) == 0 {
				qgroup = map[string]string{"g": "h", "h": "g"}[group]
			}
			m.Claim = &fsmpb.Claim{Claimant: m.Claimant, Queues: []string{g.queueIn(qgroup)}, Lease: int64(5 + r.IntN(40)), Limit: uint32(1 + r.IntN(3))}
			cmd.Op = fsmpb.Op_OP_MODIFY_CLAIM
		}
	case n < 16:
		qs := []string{g.queueIn(group)}
		if r.IntN(2) == 0 {
			qs = append(qs, g.queueIn(group))
		}
		cmd.Op = fsmpb.Op_OP_CLAIM
		cmd.Claim = &fsmpb.Claim{Claimant: g.pick(claimants[:2]), Queues: qs, Lease: int64(5 + r.IntN(40)), Limit: uint32(1 + r.IntN(4))}
	case n < 17:
		cmd.Op, cmd.Purge = fsmpb.Op_OP_PURGE, &fsmpb.Purge{Queue: g.queueIn(group)}
	case n < 19 || !allowBatch:
		cmd.Op = fsmpb.Op_OP_TICK
	default:
		cmd.Op = fsmpb.Op_OP_BATCH
		cmd.ClientId, cmd.Seq = "", 0
		for range 1 + r.IntN(3) {
			// Sub-commands are generated against the state before the
			// batch: their references are merely plausible.
			cmd.Batch = append(cmd.Batch, g.command(false))
		}
	}
	return cmd
}
