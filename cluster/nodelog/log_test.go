package nodelog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func entry(idx, term uint64, data string) *raft.Log {
	return &raft.Log{Index: idx, Term: term, Type: raft.LogCommand, Data: []byte(data),
		AppendedAt: time.Unix(1700000000, int64(idx))}
}

func open(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func store(t *testing.T, g *Group, from, to uint64, term uint64) {
	t.Helper()
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, entry(i, term, fmt.Sprintf("g%d-%d-t%d", g.id, i, term)))
	}
	if err := g.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
}

// expect checks that g holds exactly [first, last] with the data store wrote
// in term.
func expect(t *testing.T, g *Group, first, last uint64, termOf func(uint64) uint64) {
	t.Helper()
	f, _ := g.FirstIndex()
	l, _ := g.LastIndex()
	if f != first || l != last {
		t.Fatalf("group %d: span [%d, %d], want [%d, %d]", g.id, f, l, first, last)
	}
	if first == 0 {
		return
	}
	for i := first; i <= last; i++ {
		var e raft.Log
		if err := g.GetLog(i, &e); err != nil {
			t.Fatalf("group %d entry %d: %v", g.id, i, err)
		}
		want := entry(i, termOf(i), fmt.Sprintf("g%d-%d-t%d", g.id, i, termOf(i)))
		if e.Index != i || e.Term != want.Term || e.Type != want.Type || !bytes.Equal(e.Data, want.Data) || !e.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("group %d entry %d: got %+v, want %+v", g.id, i, e, *want)
		}
	}
	var e raft.Log
	if err := g.GetLog(last+1, &e); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("group %d entry %d past the end: err %v, want ErrLogNotFound", g.id, last+1, err)
	}
	if err := g.GetLog(first-1, &e); first > 1 && !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("group %d entry %d before the start: err %v, want ErrLogNotFound", g.id, first-1, err)
	}
}

func term1(uint64) uint64 { return 1 }

func TestGroupsKeepTheirOwnEntriesAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for round := uint64(0); round < 20; round++ {
		for g := uint32(1); g <= 3; g++ {
			store(t, l.Group(g), round*5+1, round*5+5, 1)
		}
	}
	if l.Segments() < 3 {
		t.Fatalf("%d segments with a 4 KiB segment size; want several", l.Segments())
	}
	for g := uint32(1); g <= 3; g++ {
		expect(t, l.Group(g), 1, 100, term1)
	}
	expect(t, l.Group(9), 0, 0, term1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Group(1).StoreLog(entry(101, 1, "x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("store after close: %v, want ErrClosed", err)
	}
	l = open(t, dir, Options{SegmentSize: 4096})
	for g := uint32(1); g <= 3; g++ {
		expect(t, l.Group(g), 1, 100, term1)
	}
	store(t, l.Group(2), 101, 110, 2)
	expect(t, l.Group(2), 1, 110, func(i uint64) uint64 { return map[bool]uint64{true: 2, false: 1}[i > 100] })
}

func TestDeleteRangeSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := l.Group(1), l.Group(2), l.Group(3)
	for _, g := range []*Group{a, b, c} {
		store(t, g, 1, 50, 1)
	}
	// a: a snapshot compacts below 21; b: a new leader's entries replace
	// 31..50; c: a snapshot install removes everything, then 101.. follow.
	if err := a.DeleteRange(1, 20); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteRange(31, 50); err != nil {
		t.Fatal(err)
	}
	store(t, b, 31, 40, 2)
	if err := c.DeleteRange(1, 50); err != nil {
		t.Fatal(err)
	}
	store(t, c, 101, 105, 3)
	if err := b.DeleteRange(10, 20); err == nil {
		t.Fatal("deleting from the middle succeeded")
	}
	if err := a.StoreLog(entry(60, 1, "gap")); err == nil {
		t.Fatal("an entry after a gap was stored")
	}
	termB := func(i uint64) uint64 { return map[bool]uint64{true: 2, false: 1}[i > 30] }
	check := func() {
		expect(t, a, 21, 50, term1)
		expect(t, b, 1, 40, termB)
		expect(t, c, 101, 105, func(uint64) uint64 { return 3 })
	}
	check()
	l.Close()
	l = open(t, dir, Options{})
	a, b, c = l.Group(1), l.Group(2), l.Group(3)
	check()
}

func TestTornTailIsClearedAndNeverReplayed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// tail is what a crash left at the end of the records.
		tail func(whole []byte) []byte
	}{
		{"half a header", func([]byte) []byte { return []byte{0x12, 0x34, 0x56} }},
		{"length beyond the file", func(w []byte) []byte { return w[:len(w)-7] }},
		{"checksum mismatch", func(w []byte) []byte {
			w = bytes.Clone(w)
			w[len(w)-1] ^= 0xff
			return w
		}},
		// A later page of the write reached the disk, an earlier one did
		// not: a whole record sits behind zeros.
		{"a whole record behind zeros", func(w []byte) []byte { return append(make([]byte, 24), w...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := Open(dir, Options{SegmentSize: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			store(t, l.Group(1), 1, 10, 1)
			end := l.active.size
			l.Close()
			seg := filepath.Join(dir, segName(1))
			// The record a crash cut short: entry 11 of group 1.
			whole := appendEntry(nil, 1, entry(11, 1, "g1-11-t1"))
			f, _ := os.OpenFile(seg, os.O_WRONLY, 0)
			f.WriteAt(tc.tail(whole), end)
			f.Close()

			l = open(t, dir, Options{SegmentSize: 64 << 10})
			expect(t, l.Group(1), 1, 10, term1)
			b, _ := os.ReadFile(seg)
			if !allZero(b[end:]) {
				t.Fatalf("bytes after the records are not cleared")
			}
			// One short entry: were the stale record left behind the
			// cleared bytes, the next open would replay it as entry 12.
			if err := l.Group(1).StoreLog(entry(11, 1, "g1-11-t1")); err != nil {
				t.Fatal(err)
			}
			l.Close()
			l = open(t, dir, Options{SegmentSize: 64 << 10})
			expect(t, l.Group(1), 1, 11, term1)
		})
	}
}

func TestDamageBeforeTheNewestSegmentRefusesToOpen(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{SegmentSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 60; i += 5 {
		store(t, l.Group(1), i, i+4, 1)
	}
	if l.Segments() < 2 {
		t.Fatalf("%d segments, want at least 2", l.Segments())
	}
	end := l.segs[1].size
	l.Close()
	seg := filepath.Join(dir, segName(1))
	b, _ := os.ReadFile(seg)
	b[end/2] ^= 0x01
	os.WriteFile(seg, b, 0o644)
	if l, err := Open(dir, Options{SegmentSize: 1024}); !errors.Is(err, ErrDamaged) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("open with a flipped bit in the oldest segment: err %v, want ErrDamaged", err)
	}
}

// A bad record with a later write after it is damage where every byte was
// acknowledged: clearing from there as if it were a torn write would drop
// acknowledged entries without a word.
func TestDamageInTheMiddleOfTheNewestSegmentRefusesToOpen(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{SegmentSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 30; i += 10 {
		store(t, l.Group(1), i, i+9, 1)
	}
	end := l.active.size
	l.Close()
	seg := filepath.Join(dir, segName(1))
	b, _ := os.ReadFile(seg)
	b[end/3] ^= 0x01
	os.WriteFile(seg, b, 0o644)
	if l, err := Open(dir, Options{SegmentSize: 1 << 20}); !errors.Is(err, ErrDamaged) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("open with a flipped bit before the last write: err %v, want ErrDamaged", err)
	}
	after, _ := os.ReadFile(seg)
	if !bytes.Equal(after, b) {
		t.Fatal("the refused open changed the segment")
	}
}

func TestSegmentsGoOnceNoGroupNeedsThem(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{SegmentSize: 2048})
	a, b := l.Group(1), l.Group(2)
	for i := uint64(1); i <= 200; i += 10 {
		store(t, a, i, i+9, 1)
		store(t, b, i, i+9, 1)
	}
	n := l.Segments()
	if n < 5 {
		t.Fatalf("%d segments, want several", n)
	}
	// b still needs everything: nothing may go.
	if err := a.DeleteRange(1, 190); err != nil {
		t.Fatal(err)
	}
	if got := l.Segments(); got < n {
		t.Fatalf("%d segments after compacting only group 1, want at least %d (group 2 still needs them)", got, n)
	}
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if got := l.Segments(); got >= n-2 {
		t.Fatalf("%d segments after group 2's reset and group 1's compaction, want fewer than %d", got, n-2)
	}
	l.Close()
	l = open(t, dir, Options{SegmentSize: 2048})
	expect(t, l.Group(1), 191, 200, term1)
	expect(t, l.Group(2), 0, 0, term1)
	store(t, l.Group(2), 1, 3, 1)
	expect(t, l.Group(2), 1, 3, term1)
}

func TestConcurrentGroupsShareSyncs(t *testing.T) {
	var syncs, synced atomic.Int64
	l := open(t, t.TempDir(), Options{OnSync: func(entries, _ int) {
		syncs.Add(1)
		synced.Add(int64(entries))
		// A disk whose fdatasync takes a millisecond: what the group
		// commit is for. On a fast, idle disk the appenders may never
		// find the writer busy, and the test would measure the disk.
		time.Sleep(time.Millisecond)
	}})
	const groups, appends = 8, 100
	var wg sync.WaitGroup
	for g := uint32(1); g <= groups; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(1); i <= appends; i++ {
				if err := l.Group(g).StoreLog(entry(i, 1, fmt.Sprintf("g%d-%d-t1", g, i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for g := uint32(1); g <= groups; g++ {
		expect(t, l.Group(g), 1, appends, term1)
	}
	if synced.Load() != groups*appends {
		t.Fatalf("syncs covered %d entries, want %d", synced.Load(), groups*appends)
	}
	// Each appender waits for its fdatasync; with eight of them, the writer
	// finds most of them queued (gather): 7-8 entries per sync here, where
	// taking the queue at once split them into cohorts of ~4.
	if syncs.Load() > groups*appends/5 {
		t.Fatalf("%d fdatasyncs for %d appends from %d groups at once: the groups do not share them", syncs.Load(), groups*appends, groups)
	}
	t.Logf("%d appends, %d fdatasyncs (%.1f entries per sync)", groups*appends, syncs.Load(), float64(groups*appends)/float64(syncs.Load()))
}

func TestReadOnlyReadsAKilledNodesLogWithoutChangingIt(t *testing.T) {
	dir := t.TempDir()
	l, _ := Open(dir, Options{})
	store(t, l.Group(4), 1, 5, 1)
	l.Close()
	seg := filepath.Join(dir, segName(1))
	f, _ := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte{1, 2, 3})
	f.Close()
	before, _ := os.ReadFile(seg)
	ro, err := Open(dir, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, ro.Group(4), 1, 5, term1)
	if err := ro.Group(4).StoreLog(entry(6, 1, "x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("store on a read-only log: %v, want ErrClosed", err)
	}
	ro.Close()
	after, _ := os.ReadFile(seg)
	if !bytes.Equal(before, after) {
		t.Fatal("a read-only open changed the segment")
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(appendEntry(nil, 3, entry(7, 2, "hello")))
	f.Add(appendInstr(nil, kindTruncate, 1, 9))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 13, 1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < headerSize {
			return
		}
		crc, n, err := readHeader(b, int64(len(b)-headerSize))
		if err != nil {
			return
		}
		rec, err := decodeBody(b[headerSize:headerSize+n], crc)
		if err != nil || rec.kind != kindEntry {
			return
		}
		// A record that decodes must survive re-encoding unchanged (the
		// bytes may differ: a uvarint can be written longer than needed).
		var l raft.Log
		rec.toLog(&l)
		again := appendEntry(nil, rec.group, &l)
		crc2, n2, err := readHeader(again, int64(len(again)-headerSize))
		if err != nil {
			t.Fatal(err)
		}
		rec2, err := decodeBody(again[headerSize:headerSize+n2], crc2)
		if err != nil {
			t.Fatalf("re-encoded %+v does not decode: %v", rec, err)
		}
		if rec2.group != rec.group || rec2.index != rec.index || rec2.term != rec.term || rec2.typ != rec.typ ||
			rec2.appendedAt != rec.appendedAt || !bytes.Equal(rec2.data, rec.data) || !bytes.Equal(rec2.ext, rec.ext) {
			t.Fatalf("decoded %+v, after re-encoding %+v", rec, rec2)
		}
	})
}
