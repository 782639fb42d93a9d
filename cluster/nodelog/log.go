package nodelog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/raft"
)

// DefaultSegmentSize is when the writer starts a new segment file.
const DefaultSegmentSize = 64 << 20

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("nodelog: closed")

// ErrDamaged wraps damage Open found: a bad record that is not a torn
// write at the end of the newest segment. Damage that can be tied to one
// group (a whole record of that group's that fails its checksum, with good
// records after it, or a gap in its indexes) makes that group damaged
// (Group.Damaged) and the log opens for the others; damage that cannot be
// tied to one group makes Open fail.
var ErrDamaged = errors.New("nodelog: damaged segment")

// Options configure Open.
type Options struct {
	// SegmentSize is the size after which a new segment starts; default
	// DefaultSegmentSize.
	SegmentSize int64
	// ReadOnly opens for reading only (a stopped or killed node's log, for
	// checkers): nothing is written, cut or deleted, and a torn tail is
	// simply not read.
	ReadOnly bool
	// Logger gets a warning when a torn tail is cut; default slog.Default().
	Logger *slog.Logger
	// DiskFree, when set, measures the bytes free on the log's file
	// system: a segment is zero-filled only as far as a quarter of them
	// (zeroed), so that a small disk can start a node. Nil: every segment
	// is zero-filled to SegmentSize.
	DiskFree func(dir string) (uint64, error)
	// OnSync, when set, is called after every fsync or fdatasync the log
	// makes, with the entries and bytes it made durable (0 and 0 for a
	// directory sync). It runs on the writer goroutine: keep it cheap.
	OnSync func(entries, bytes int)
}

// Log is a node's shared Raft log. Its methods are safe for concurrent use;
// each group's mutations must come one at a time (hashicorp/raft makes them
// from the group's main loop).
type Log struct {
	dir  string
	opts Options

	mu     sync.RWMutex
	groups map[uint32]*index
	// damaged: groups whose entries Open found damaged, and why. Their
	// records are ignored until a reset of the group (its replica rebuilt).
	damaged map[uint32]error
	segs    map[uint32]*segment
	order   []uint32 // segment seqs, oldest first
	active  *segment
	gen     uint64

	qmu     sync.Mutex
	queue   []*request
	closed  bool
	wake    chan struct{}
	stopped chan struct{}
	werr    error // a failed fdatasync: no write succeeds after it
	wbuf    []byte

	// smallDisk: the disk was found too small for whole zero-filled
	// segments (zeroed), said once.
	smallDisk atomic.Bool
	// The next segment, zero-filled in the background (rotate).
	spare     chan spare
	preparing bool
}

// index is what memory holds of one group: where its live entries are.
type index struct {
	first uint64 // index of locs[0]
	locs  []loc
	gen   uint64 // changes on reset, so old segments' refs go stale
	bytes int64
}

func (x *index) empty() bool  { return len(x.locs) == 0 }
func (x *index) last() uint64 { return x.first + uint64(len(x.locs)) - 1 }

type loc struct {
	seg uint32
	off uint32
	n   uint32
}

type segment struct {
	seq  uint32
	path string
	f    *os.File
	size int64
	// refs: per group, the generation and highest index of the entries
	// written here, to tell when none of them is live.
	refs map[uint32]segRef
}

type segRef struct{ gen, max uint64 }

type request struct {
	group uint32
	ops   []op
	buf   []byte
	done  chan error
}

// op is one record of a request: its kind and index, and where its bytes
// are in the request's buf.
type op struct {
	kind  byte
	index uint64
	off   int
	n     int
}

func segName(seq uint32) string { return fmt.Sprintf("%08x.wal", seq) }

// Open opens (or, unless read-only, creates) the log in dir and replays it.
func Open(dir string, opts Options) (*Log, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &Log{dir: dir, opts: opts, groups: map[uint32]*index{}, damaged: map[uint32]error{}, segs: map[uint32]*segment{},
		wake: make(chan struct{}, 1), stopped: make(chan struct{}), spare: make(chan spare, 1)}
	if !opts.ReadOnly {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var seqs []uint32
	for _, e := range names {
		if strings.HasSuffix(e.Name(), ".wal.tmp") && !opts.ReadOnly {
			os.Remove(filepath.Join(dir, e.Name())) // a spare segment from before a crash
			continue
		}
		name, ok := strings.CutSuffix(e.Name(), ".wal")
		if !ok || e.IsDir() {
			continue
		}
		seq, err := strconv.ParseUint(name, 16, 32)
		if err != nil || segName(uint32(seq)) != e.Name() {
			continue
		}
		seqs = append(seqs, uint32(seq))
	}
	slices.Sort(seqs)
	for i, seq := range seqs {
		if err := l.replay(seq, i == len(seqs)-1); err != nil {
			l.closeFiles()
			return nil, err
		}
	}
	// Only now is it known which damage still counts: a reset recorded
	// after a bad record (a rebuilt replica) clears it, and saying at every
	// start that such a group will not start, when it then does, misleads.
	for _, g := range slices.Sorted(maps.Keys(l.damaged)) {
		l.opts.Logger.Error("a Raft log entry is damaged: its group will not start on this node", "group", g, "err", l.damaged[g])
	}
	if opts.ReadOnly {
		close(l.stopped)
		l.closed = true
		return l, nil
	}
	if len(seqs) == 0 {
		if err := l.rotate(); err != nil {
			l.closeFiles()
			return nil, err
		}
	}
	l.collect()
	go l.run()
	return l, nil
}

// replay reads one segment and applies its records. A torn record ends the
// newest segment (cut there unless read-only); anywhere else it is damage.
func (l *Log) replay(seq uint32, newest bool) error {
	path := filepath.Join(l.dir, segName(seq))
	flag := os.O_RDWR
	if l.opts.ReadOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	s := l.addSegment(seq, path, f)
	size := fi.Size()
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), 1<<20)
	var off int64
	var torn error
	h := make([]byte, headerSize)
	var body []byte
	for off < size {
		k, err := io.ReadFull(r, h)
		if err != nil {
			if allZero(h[:k]) {
				break // zeros too short for a header: the end
			}
			torn = fmt.Errorf("%w: short header", errTorn)
			break
		}
		if allZero(h) {
			// The end of what was written into a zero-filled segment.
			break
		}
		crc, n, err := readHeader(h, size-off-headerSize)
		if err != nil {
			torn = err
			break
		}
		if cap(body) < n {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			torn = fmt.Errorf("%w: short body", errTorn)
			break
		}
		rec, err := decodeBody(body, crc)
		if err != nil {
			if g, ok := l.confined(f, body, off, off+int64(headerSize+n), size, newest); ok {
				l.damaged[g] = fmt.Errorf("%w: %s at offset %d: an entry of group %d fails its checksum (%v)", ErrDamaged, path, off, g, err)
				off += int64(headerSize + n)
				continue
			}
			torn = err
			break
		}
		if err := l.apply(s, rec.kind, rec.group, rec.index, uint32(off), uint32(headerSize+n)); err != nil {
			var gap *gapError
			if !errors.As(err, &gap) {
				return fmt.Errorf("%w: %s at offset %d: %v", ErrDamaged, path, off, err)
			}
			l.damaged[gap.group] = fmt.Errorf("%w: %s at offset %d: a group's Raft log entries are not consecutive: %v", ErrDamaged, path, off, err)
		}
		off += int64(headerSize + n)
	}
	s.size = off
	if torn != nil && !newest {
		return fmt.Errorf("%w: %s at offset %d of %d: %v", ErrDamaged, path, off, size, torn)
	}
	if torn != nil {
		// A torn write is the last one: a whole batch after the bad
		// record means the damage is in the middle, where every byte was
		// acknowledged, and clearing from here would drop them silently.
		later, err := batchAfter(f, off, size)
		if err != nil {
			return fmt.Errorf("read the tail of %s: %w", path, err)
		}
		if later >= 0 {
			return fmt.Errorf("%w: %s at offset %d (%v), with a later write at offset %d: damage, not a torn write", ErrDamaged, path, off, torn, later)
		}
	}
	if !newest || l.opts.ReadOnly {
		return nil
	}
	// Appends go on at off, over zeros. Whatever else is past it was a
	// write a crash interrupted: never acknowledged (an append returns after
	// its fdatasync), so clearing it loses nothing. It must be cleared, not
	// just skipped: a crash can persist a later page of a write and not an
	// earlier one, and a whole stale record left behind later appends would
	// be replayed as theirs.
	dirty, err := nonZeroAfter(f, off, size)
	if err != nil {
		return fmt.Errorf("read the tail of %s: %w", path, err)
	}
	if torn == nil && !dirty {
		return nil
	}
	if torn == nil {
		torn = fmt.Errorf("%w: bytes after the end of the records", errTorn)
	}
	l.opts.Logger.Warn("clearing a torn write at the end of the Raft log", "segment", path, "offset", off, "bytes_cleared", size-off, "reason", torn)
	if err := zeroFill(f, off, size); err != nil {
		return fmt.Errorf("clear torn tail of %s: %w", path, err)
	}
	if err := l.sync(f, 0, 0); err != nil {
		return fmt.Errorf("clear torn tail of %s: %w", path, err)
	}
	return nil
}

// confined reports whether a record whose body fails its checksum is
// damage within one group's entry, and whose: the record's length is
// trusted only because a whole, good record follows it at next, and its
// group only because the record continues that group's entries (kind entry,
// index last+1), or the group is already damaged. Anything less (a bad
// length, a bad record at the end of a segment, a group or index that does
// not fit) cannot be tied to one group. In the newest segment a later
// batch must follow too: bad bytes in the last batch are a torn write (a
// crash may persist a later page of a write and not an earlier one), which
// Open cuts.
func (l *Log) confined(f *os.File, body []byte, off, next, size int64, newest bool) (uint32, bool) {
	if len(body) < fixedBody+fixedEntry || body[0] != kindEntry || next+headerSize > size {
		return 0, false
	}
	if newest {
		if later, err := batchAfter(f, off, size); err != nil || later < 0 {
			return 0, false
		}
	}
	g := binary.BigEndian.Uint32(body[1:])
	idx := binary.BigEndian.Uint64(body[5:])
	x := l.groups[g]
	continues := l.damaged[g] != nil || x != nil && !x.empty() && idx == x.last()+1
	// Walk the good records after it: the first must be good (else the
	// length is not trusted), and, unless the record continues its group,
	// the group's next entry must be among them (the group's first entry in
	// the log has nothing before it to continue).
	for at := next; at+headerSize <= size; {
		h := make([]byte, headerSize)
		if _, err := f.ReadAt(h, at); err != nil {
			return 0, false
		}
		crc, n, err := readHeader(h, size-at-headerSize)
		if err != nil {
			return 0, false
		}
		b := make([]byte, n)
		if _, err := f.ReadAt(b, at+headerSize); err != nil {
			return 0, false
		}
		rec, err := decodeBody(b, crc)
		if err != nil {
			return 0, false
		}
		if continues || rec.kind == kindEntry && rec.group == g && rec.index == idx+1 {
			return g, true
		}
		at += int64(headerSize + n)
	}
	return 0, false
}

// gapError: a group's entry does not follow its last one.
type gapError struct {
	group     uint32
	idx, last uint64
}

func (e *gapError) Error() string {
	return fmt.Sprintf("group %d: entry %d follows %d", e.group, e.idx, e.last)
}

// batchAfter returns the offset of the first whole batch header in f after
// from, or -1.
func batchAfter(f *os.File, from, to int64) (int64, error) {
	if to-from <= 1 {
		return -1, nil
	}
	b := make([]byte, to-from-1)
	if _, err := f.ReadAt(b, from+1); err != nil && !errors.Is(err, io.EOF) {
		return -1, err
	}
	for i := 0; i+batchHeaderSize <= len(b); i++ {
		// Cheap filter first: the length field of a batch header.
		if b[i+4] != 0 || b[i+5] != 0 || b[i+6] != 0 || b[i+7] != fixedBody {
			continue
		}
		crc, n, err := readHeader(b[i:i+headerSize], int64(len(b)-i-headerSize))
		if err != nil {
			continue
		}
		if rec, err := decodeBody(b[i+headerSize:i+headerSize+n], crc); err == nil && rec.kind == kindBatch {
			return from + 1 + int64(i), nil
		}
	}
	return -1, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// nonZeroAfter reports whether f holds a non-zero byte in [from, to).
func nonZeroAfter(f *os.File, from, to int64) (bool, error) {
	buf := make([]byte, 1<<20)
	for off := from; off < to; {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), to-off)], off)
		if !allZero(buf[:n]) {
			return true, nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return false, nil
			}
			return false, err
		}
		off += int64(n)
	}
	return false, nil
}

// zeroFill writes zeros over [from, to) of f, one page per write. The page
// cache sizes a folio by the write that creates it: a segment zero-filled in
// 1 MiB writes is cached in 1 MiB folios, and every later append of a few
// hundred bytes then dirties, and its fdatasync writes back, a whole MiB
// (measured here: 1,048,785 bytes written per fdatasync against 4,323 with
// page-sized fills; taskbench showed ~390 KB written per task per node).
// Sixteen thousand small writes per 64 MiB segment, in the background, cost
// far less than that.
func zeroFill(f *os.File, from, to int64) error {
	buf := make([]byte, zeroFillChunk)
	for off := from; off < to; {
		n := min(int64(len(buf)), to-off)
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// apply makes one record's effect on the indexes. Callers hold mu (or are
// Open, before anything else runs).
func (l *Log) apply(s *segment, kind byte, group uint32, idx uint64, off, n uint32) error {
	if kind == kindReset {
		if l.damaged[group] != nil {
			l.opts.Logger.Debug("a damaged Raft log record of a group reset after it is ignored", "group", group, "damage", l.damaged[group])
		}
		delete(l.damaged, group)
	} else if kind != kindBatch && l.damaged[group] != nil {
		return nil
	}
	x := l.groups[group]
	if x == nil {
		l.gen++
		x = &index{gen: l.gen}
		l.groups[group] = x
	}
	switch kind {
	case kindEntry:
		if x.empty() {
			x.first = idx
		} else if idx != x.last()+1 {
			return &gapError{group: group, idx: idx, last: x.last()}
		}
		x.locs = append(x.locs, loc{seg: s.seq, off: off, n: n})
		x.bytes += int64(n)
		s.refs[group] = segRef{gen: x.gen, max: idx}
	case kindCompact:
		if x.empty() || idx <= x.first {
			return nil
		}
		k := min(idx-x.first, uint64(len(x.locs)))
		x.bytes -= sumBytes(x.locs[:k])
		x.locs = x.locs[k:]
		x.first += k
	case kindTruncate:
		if x.empty() || idx > x.last() {
			return nil
		}
		keep := uint64(0)
		if idx > x.first {
			keep = idx - x.first
		}
		x.bytes -= sumBytes(x.locs[keep:])
		x.locs = x.locs[:keep:keep]
	case kindBatch:
	case kindReset:
		l.gen++
		*x = index{gen: l.gen}
	default:
		return fmt.Errorf("unknown record kind %d", kind)
	}
	return nil
}

func sumBytes(ls []loc) int64 {
	var n int64
	for _, l := range ls {
		n += int64(l.n)
	}
	return n
}

// rotate starts a new segment: the one prepared in the background if it is
// there (renamed into place), else one made now. Segments are zero-filled
// to SegmentSize before use, so an append overwrites allocated blocks and
// its fdatasync need not journal a new file size: measured here, 180 µs
// instead of 280 µs per call, and a third less kernel CPU. Callers hold mu
// or are Open.
func (l *Log) rotate() error {
	var seq uint32 = 1
	if l.active != nil {
		seq = l.active.seq + 1
	}
	path := filepath.Join(l.dir, segName(seq))
	var f *os.File
	if l.preparing {
		sp := <-l.spare
		l.preparing = false
		if sp.err == nil && sp.seq == seq {
			if err := os.Rename(sp.f.Name(), path); err == nil {
				f = sp.f
			}
		}
		if f == nil && sp.f != nil {
			sp.f.Close()
			os.Remove(sp.f.Name())
		}
	}
	if f == nil {
		var err error
		if f, err = l.zeroed(path); err != nil {
			return err
		}
	}
	if err := l.syncDir(); err != nil {
		f.Close()
		return err
	}
	l.addSegment(seq, path, f)
	if !l.opts.ReadOnly {
		l.preparing = true
		go func() {
			f, err := l.zeroed(filepath.Join(l.dir, segName(seq+1)+".tmp"))
			l.spare <- spare{seq: seq + 1, f: f, err: err}
		}()
	}
	return nil
}

// zeroFillChunk is the size of each zeroFill write: one page.
const zeroFillChunk = 4096

type spare struct {
	seq uint32
	f   *os.File
	err error
}

// zeroed creates a segment file of SegmentSize zeros, synced; on a disk
// with less than four times that free, as many zeros as a quarter of the
// free space (appends past them grow the file, at the cost of a slower
// fdatasync), so that a small volume can start a node and the segment
// being prepared, the state and snapshots still have room.
func (l *Log) zeroed(path string) (*os.File, error) {
	fill := l.opts.SegmentSize
	var free uint64
	if l.opts.DiskFree != nil {
		var err error
		if free, err = l.opts.DiskFree(l.dir); err == nil && free/4 < uint64(fill) {
			fill = int64(free/4) &^ (zeroFillChunk - 1)
			if !l.smallDisk.Swap(true) {
				l.opts.Logger.Warn("the data disk is small: Raft log segments are zero-filled only in part, which makes appends slower",
					"free_bytes", free, "zero_filled_bytes", fill, "segment_bytes", l.opts.SegmentSize)
			}
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	if err := zeroFill(f, 0, fill); err != nil {
		f.Close()
		os.Remove(path)
		if errors.Is(err, syscall.ENOSPC) {
			return nil, fmt.Errorf("nodelog: no space for a new Raft log segment in %s: it takes up to %d bytes and %d of them are written up front (measured free: %d): %w",
				l.dir, l.opts.SegmentSize, fill, free, err)
		}
		return nil, err
	}
	if err := l.sync(f, 0, 0); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return f, nil
}

// addSegment makes f, segment seq, the newest one.
func (l *Log) addSegment(seq uint32, path string, f *os.File) *segment {
	s := &segment{seq: seq, path: path, f: f, refs: map[uint32]segRef{}}
	l.segs[seq] = s
	l.order = append(l.order, seq)
	l.active = s
	return s
}

func (l *Log) syncDir() error {
	d, err := os.Open(l.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return l.sync(d, 0, 0)
}

// sync makes f durable and counts it.
func (l *Log) sync(f *os.File, entries, bytes int) error {
	err := fdatasync(f)
	if l.opts.OnSync != nil {
		l.opts.OnSync(entries, bytes)
	}
	return err
}

// collect deletes the oldest segments while none of their entries is live.
// Only a prefix is ever deleted, so every removal instruction stays on disk
// as long as an entry it removes does. Callers hold mu or are Open.
func (l *Log) collect() {
	for len(l.order) > 1 {
		s := l.segs[l.order[0]]
		if s == l.active || l.holdsLive(s) {
			return
		}
		s.f.Close()
		if err := os.Remove(s.path); err != nil {
			// Replaying it after a restart is harmless: the removals of
			// its entries are in later segments.
			l.opts.Logger.Warn("delete a Raft log segment no longer needed", "segment", s.path, "err", err)
		}
		delete(l.segs, s.seq)
		l.order = l.order[1:]
	}
}

func (l *Log) holdsLive(s *segment) bool {
	for g, ref := range s.refs {
		x := l.groups[g]
		if x != nil && x.gen == ref.gen && !x.empty() && x.first <= ref.max {
			return true
		}
	}
	return false
}

// submit queues r for the writer and waits for its fdatasync.
func (l *Log) submit(r *request) error {
	r.done = make(chan error, 1)
	l.qmu.Lock()
	if l.closed {
		l.qmu.Unlock()
		return ErrClosed
	}
	l.queue = append(l.queue, r)
	l.qmu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return <-r.done
}

// run is the writer: it writes whatever is queued, from every group, with
// one write and one fdatasync, then lets the callers go.
func (l *Log) run() {
	defer close(l.stopped)
	var batch []*request
	for {
		<-l.wake
		l.gather()
		l.qmu.Lock()
		batch, l.queue = l.queue, batch[:0]
		closed := l.closed
		l.qmu.Unlock()
		if len(batch) > 0 {
			l.commit(batch)
			clear(batch)
		}
		if closed {
			return
		}
	}
}

// gather lets the goroutines that are ready to append do so before the
// writer takes the queue: woken by the first append, it would otherwise
// take that one alone while the other groups' appenders, released by the
// previous fdatasync, are still waiting for a CPU (with GOMAXPROCS=1 the
// woken writer runs next), and the groups would split into cohorts that
// each pay an fdatasync. It yields while that makes the queue grow, a few
// times at most.
func (l *Log) gather() {
	n := -1
	for range 3 {
		l.qmu.Lock()
		m := len(l.queue)
		l.qmu.Unlock()
		if m == n {
			return
		}
		n = m
		runtime.Gosched()
	}
}

func (l *Log) commit(batch []*request) {
	fail := func(err error) {
		for _, r := range batch {
			r.done <- err
		}
	}
	if l.werr != nil {
		fail(l.werr)
		return
	}
	l.wbuf = appendInstr(l.wbuf[:0], kindBatch, 0, 0)
	entries := 0
	for _, r := range batch {
		l.wbuf = append(l.wbuf, r.buf...)
		for _, o := range r.ops {
			if o.kind == kindEntry {
				entries++
			}
		}
	}
	appendInstr(l.wbuf[:0], kindBatch, 0, uint64(len(l.wbuf)-batchHeaderSize)) // the length, in place
	if l.active.size > 0 && l.active.size+int64(len(l.wbuf)) > l.opts.SegmentSize {
		l.mu.Lock()
		err := l.rotate()
		l.mu.Unlock()
		if err != nil {
			fail(fmt.Errorf("nodelog: start a segment: %w", err))
			return
		}
	}
	s := l.active
	base := s.size
	if _, err := s.f.WriteAt(l.wbuf, base); err != nil {
		// Nothing was acknowledged from these bytes; drop them so a later
		// batch (after space is freed, say) does not follow garbage.
		if terr := s.f.Truncate(base); terr != nil {
			l.werr = fmt.Errorf("nodelog: write failed (%v) and could not be undone: %w", err, terr)
		}
		fail(fmt.Errorf("nodelog: write: %w", err))
		return
	}
	if err := l.sync(s.f, entries, len(l.wbuf)); err != nil {
		// After a failed fdatasync the kernel may have dropped the dirty
		// pages: what is on disk is unknown, so nothing more is written.
		l.werr = fmt.Errorf("nodelog: fdatasync failed, refusing further writes until restart: %w", err)
		fail(l.werr)
		return
	}
	s.size = base + int64(len(l.wbuf))
	l.mu.Lock()
	off := base + batchHeaderSize
	var errs []error
	removed := false
	for _, r := range batch {
		var err error
		for _, o := range r.ops {
			if e := l.apply(s, o.kind, r.group, o.index, uint32(off+int64(o.off)), uint32(o.n)); e != nil && err == nil {
				err = e
			}
			removed = removed || o.kind != kindEntry
		}
		off += int64(len(r.buf))
		errs = append(errs, err)
	}
	if removed {
		l.collect()
	}
	l.mu.Unlock()
	for i, r := range batch {
		r.done <- errs[i]
	}
}

// Close stops the writer after it has written what is queued, and closes
// the files.
func (l *Log) Close() error {
	l.qmu.Lock()
	already := l.closed
	l.closed = true
	l.qmu.Unlock()
	if !already {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	<-l.stopped
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.preparing {
		if sp := <-l.spare; sp.f != nil {
			sp.f.Close()
			os.Remove(sp.f.Name())
		}
		l.preparing = false
	}
	return l.closeFiles()
}

func (l *Log) closeFiles() error {
	var errs []error
	for _, s := range l.segs {
		if s.f != nil {
			errs = append(errs, s.f.Close())
			s.f = nil
		}
	}
	return errors.Join(errs...)
}

// Groups lists the groups that have entries.
func (l *Log) Groups() []uint32 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []uint32
	for g, x := range l.groups {
		if !x.empty() {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}

// Segments is how many segment files the log has.
func (l *Log) Segments() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.order)
}

// Group is the raft.LogStore of one group.
func (l *Log) Group(id uint32) *Group { return &Group{l: l, id: id} }

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
