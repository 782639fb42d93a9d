package nodelog

import (
	"fmt"

	"github.com/hashicorp/raft"
)

// Group is one group's view of the node's log: a raft.LogStore.
type Group struct {
	l  *Log
	id uint32
}

var (
	_ raft.LogStore          = (*Group)(nil)
	_ raft.MonotonicLogStore = (*Group)(nil)
)

// span is the group's first and last index (0, 0 when empty).
func (g *Group) span() (first, last uint64) {
	g.l.mu.RLock()
	defer g.l.mu.RUnlock()
	x := g.l.groups[g.id]
	if x == nil || x.empty() {
		return 0, 0
	}
	return x.first, x.last()
}

// FirstIndex implements raft.LogStore.
func (g *Group) FirstIndex() (uint64, error) {
	first, _ := g.span()
	return first, nil
}

// LastIndex implements raft.LogStore.
func (g *Group) LastIndex() (uint64, error) {
	_, last := g.span()
	return last, nil
}

// Bytes is the size of the group's live entries on disk.
func (g *Group) Bytes() int64 {
	g.l.mu.RLock()
	defer g.l.mu.RUnlock()
	if x := g.l.groups[g.id]; x != nil {
		return x.bytes
	}
	return 0
}

// Damaged returns why Open found the group's entries damaged (wrapping
// ErrDamaged), or nil. A damaged group must not run: its log has a hole.
// Reset clears it.
func (g *Group) Damaged() error {
	g.l.mu.RLock()
	defer g.l.mu.RUnlock()
	return g.l.damaged[g.id]
}

// GetLog implements raft.LogStore.
func (g *Group) GetLog(idx uint64, out *raft.Log) error {
	if err := g.Damaged(); err != nil {
		return err
	}
	buf, err := g.read(idx)
	if err != nil {
		return err
	}
	crc, n, err := readHeader(buf, int64(len(buf)-headerSize))
	if err != nil || n != len(buf)-headerSize {
		return fmt.Errorf("nodelog: group %d entry %d: %w", g.id, idx, errTorn)
	}
	rec, err := decodeBody(buf[headerSize:], crc)
	if err != nil {
		return fmt.Errorf("nodelog: group %d entry %d: %w", g.id, idx, err)
	}
	if rec.kind != kindEntry || rec.group != g.id || rec.index != idx {
		return fmt.Errorf("nodelog: group %d entry %d: found group %d index %d kind %d there", g.id, idx, rec.group, rec.index, rec.kind)
	}
	rec.toLog(out)
	return nil
}

func (g *Group) read(idx uint64) ([]byte, error) {
	g.l.mu.RLock()
	defer g.l.mu.RUnlock()
	x := g.l.groups[g.id]
	if x == nil || x.empty() || idx < x.first || idx > x.last() {
		return nil, raft.ErrLogNotFound
	}
	lc := x.locs[idx-x.first]
	s := g.l.segs[lc.seg]
	if s == nil || s.f == nil {
		return nil, ErrClosed
	}
	buf := make([]byte, lc.n)
	if _, err := s.f.ReadAt(buf, int64(lc.off)); err != nil {
		return nil, fmt.Errorf("nodelog: read group %d entry %d: %w", g.id, idx, err)
	}
	return buf, nil
}

// StoreLog implements raft.LogStore.
func (g *Group) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore. The entries must continue the group's
// log without a gap (hashicorp/raft removes every entry before it stores
// past a gap, because Group is a raft.MonotonicLogStore).
func (g *Group) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	if err := g.Damaged(); err != nil {
		return err
	}
	first, last := g.span()
	want := logs[0].Index
	if first != 0 && want != last+1 {
		return fmt.Errorf("nodelog: group %d: entry %d does not follow the last one, %d", g.id, want, last)
	}
	r := &request{group: g.id, ops: make([]op, 0, len(logs))}
	for i, e := range logs {
		if e.Index != want+uint64(i) {
			return fmt.Errorf("nodelog: group %d: entries %d and %d are not consecutive", g.id, logs[i-1].Index, e.Index)
		}
		start := len(r.buf)
		r.buf = appendEntry(r.buf, g.id, e)
		r.ops = append(r.ops, op{kind: kindEntry, index: e.Index, off: start, n: len(r.buf) - start})
	}
	return g.l.submit(r)
}

// DeleteRange implements raft.LogStore. Raft removes a prefix (after a
// snapshot), a suffix (entries that conflict with a new leader's) or all.
func (g *Group) DeleteRange(lo, hi uint64) error {
	first, last := g.span()
	if first == 0 || hi < first || lo > last {
		return nil
	}
	switch {
	case lo <= first && hi >= last:
		return g.instr(kindReset, 0)
	case lo <= first:
		return g.instr(kindCompact, hi+1)
	case hi >= last:
		return g.instr(kindTruncate, lo)
	}
	return fmt.Errorf("nodelog: group %d: cannot delete [%d, %d] from the middle of [%d, %d]", g.id, lo, hi, first, last)
}

// Reset removes all the group's entries (its replica was deleted).
func (g *Group) Reset() error { return g.instr(kindReset, 0) }

func (g *Group) instr(kind byte, idx uint64) error {
	buf := appendInstr(nil, kind, g.id, idx)
	return g.l.submit(&request{group: g.id, buf: buf, ops: []op{{kind: kind, index: idx, n: len(buf)}}})
}

// IsMonotonic implements raft.MonotonicLogStore.
func (g *Group) IsMonotonic() bool { return true }
