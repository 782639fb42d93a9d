package nodelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recordAt finds, in segment file path, the record of kind entry of group g
// at index idx and returns its offset and body length.
func recordAt(t *testing.T, path string, g uint32, idx uint64) (off int64, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for o := 0; o+headerSize <= len(b); {
		size := int(binary.BigEndian.Uint32(b[o+4:]))
		if size == 0 {
			break
		}
		body := b[o+headerSize : o+headerSize+size]
		if body[0] == kindEntry && binary.BigEndian.Uint32(body[1:]) == g && binary.BigEndian.Uint64(body[5:]) == idx {
			return int64(o), size
		}
		o += headerSize + size
	}
	t.Fatalf("no entry %d of group %d in %s", idx, g, path)
	return 0, 0
}

func flip(t *testing.T, path string, at int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x40
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedEntryStopsOnlyItsGroup: a flipped byte in
// one entry of one group, in an older segment or in the middle of the
// newest, makes that group damaged (it reads and stores nothing) while the
// log opens and every other group reads its entries. A reset (the replica
// rebuilt) clears it for good: reopening does not find the old damage again.
func TestDamagedEntryStopsOnlyItsGroup(t *testing.T) {
	for _, tc := range []struct {
		name string
		seg  func(l *Log) uint32 // the segment to damage
	}{
		{"older segment", func(l *Log) uint32 { return l.order[0] }},
		{"middle of the newest segment", func(l *Log) uint32 { return l.active.seq }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{SegmentSize: 4096}
			l := open(t, dir, opts)
			for i := uint64(1); i <= 60; i += 3 {
				store(t, l.Group(1), i, i+2, 1)
				store(t, l.Group(2), i, i+2, 1)
			}
			seq := tc.seg(l)
			path := filepath.Join(dir, segName(seq))
			// An entry of group 1 in that segment, with more after it.
			var victim uint64
			l.mu.RLock()
			for i, lc := range l.groups[1].locs {
				if lc.seg == seq {
					victim = l.groups[1].first + uint64(i)
					break
				}
			}
			l.mu.RUnlock()
			l.Close()
			off, n := recordAt(t, path, 1, victim)
			flip(t, path, off+headerSize+int64(n)-3) // in the entry's data

			var logged bytes.Buffer
			opts.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			l = open(t, dir, opts)
			if !strings.Contains(logged.String(), "a Raft log entry is damaged") {
				t.Fatalf("opened with a damaged entry, logged: %s", logged.String())
			}
			err := l.Group(1).Damaged()
			if !errors.Is(err, ErrDamaged) {
				t.Fatalf("group 1 after a flipped byte in its entry %d: Damaged() = %v", victim, err)
			}
			if err := l.Group(1).StoreLogs(nil); err != nil {
				t.Fatal(err)
			}
			if err := l.Group(1).StoreLog(entry(61, 1, "x")); err == nil {
				t.Fatal("a damaged group accepted an append")
			}
			expect(t, l.Group(2), 1, 60, term1)
			if err := l.Group(2).Damaged(); err != nil {
				t.Fatalf("group 2: %v", err)
			}
			// Rebuilt: reset, then filled again.
			if err := l.Group(1).Reset(); err != nil {
				t.Fatal(err)
			}
			if err := l.Group(1).Damaged(); err != nil {
				t.Fatalf("after a reset: %v", err)
			}
			store(t, l.Group(1), 100, 104, 2)
			l.Close()
			logged.Reset()
			l = open(t, dir, opts)
			defer l.Close()
			// The record is still there, before the reset: the group
			// starts, and the log must not say it will not.
			if strings.Contains(logged.String(), "damaged") {
				t.Fatalf("reopened after the reset, logged: %s", logged.String())
			}
			if err := l.Group(1).Damaged(); err != nil {
				t.Fatalf("reopened after the reset: %v", err)
			}
			expect(t, l.Group(1), 100, 104, func(uint64) uint64 { return 2 })
			expect(t, l.Group(2), 1, 60, term1)
		})
	}
}

// TestDamageNoGroupCanOwnRefusesToOpen: a flipped length or group field
// cannot be tied to one group, so the log refuses to open rather than
// guess.
func TestDamageNoGroupCanOwnRefusesToOpen(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   func(off int64) int64
	}{
		{"length", func(off int64) int64 { return off + 6 }},
		{"group", func(off int64) int64 { return off + headerSize + 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{SegmentSize: 4096}
			l := open(t, dir, opts)
			for i := uint64(1); i <= 60; i += 3 {
				store(t, l.Group(1), i, i+2, 1)
			}
			seq := l.order[0]
			l.Close()
			path := filepath.Join(dir, segName(seq))
			off, _ := recordAt(t, path, 1, 5)
			flip(t, path, tc.at(off))
			if l, err := Open(dir, opts); !errors.Is(err, ErrDamaged) {
				if l != nil {
					l.Close()
				}
				t.Fatalf("open with a damaged %s field: %v, want ErrDamaged", tc.name, err)
			}
		})
	}
}
