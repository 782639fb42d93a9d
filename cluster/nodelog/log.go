package nodelog

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
