package nodelog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

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
