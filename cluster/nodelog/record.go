package nodelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
)

// Record kinds.
const (
	kindEntry    byte = 1 // one Raft entry of a group
	kindCompact  byte = 2 // remove the group's entries below index
	kindTruncate byte = 3 // remove the group's entries from index on
	kindReset    byte = 4 // remove all the group's entries
	// kindBatch starts each write: index is the byte length of the records
	// that follow in it. Only the last write can be torn by a crash, so a
	// bad record followed by a later batch is damage, not a torn write.
	kindBatch byte = 5
)

// batchHeaderSize is the size of a kindBatch record.
const batchHeaderSize = headerSize + fixedBody

const (
	headerSize = 8
	// maxBody bounds a record: a larger length in a header is damage (or a
	// torn header), never a real record. Raft entries carry one command, far
	// below this.
	maxBody = 256 << 20
	// fixedBody is kind, group and index, which every record has.
	fixedBody = 1 + 4 + 8
	// fixedEntry is the rest of an entry's fixed part: term, type, time.
	fixedEntry = 8 + 1 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is a decoded record body.
type record struct {
	kind  byte
	group uint32
	index uint64
	// entry only
	term       uint64
	typ        raft.LogType
	appendedAt int64
	data, ext  []byte
}

// appendEntry encodes l as group's entry record onto b.
func appendEntry(b []byte, group uint32, l *raft.Log) []byte {
	start := len(b)
	b = append(b, make([]byte, headerSize)...)
	b = append(b, kindEntry)
	b = binary.BigEndian.AppendUint32(b, group)
	b = binary.BigEndian.AppendUint64(b, l.Index)
	b = binary.BigEndian.AppendUint64(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	b = append(b, l.Extensions...)
	return seal(b, start)
}

// appendInstr encodes a removal instruction onto b.
func appendInstr(b []byte, kind byte, group uint32, index uint64) []byte {
	start := len(b)
	b = append(b, make([]byte, headerSize)...)
	b = append(b, kind)
	b = binary.BigEndian.AppendUint32(b, group)
	b = binary.BigEndian.AppendUint64(b, index)
	return seal(b, start)
}

// seal fills in the header of the record that starts at b[start:].
func seal(b []byte, start int) []byte {
	body := b[start+headerSize:]
	binary.BigEndian.PutUint32(b[start:], crc32.Checksum(body, castagnoli))
	binary.BigEndian.PutUint32(b[start+4:], uint32(len(body)))
	return b
}

// errTorn marks bytes that are not a whole record: the end of the written
// part of a segment, or damage.
var errTorn = errors.New("not a whole record")

// readHeader checks a header and returns the body length it announces.
// avail is how many bytes follow the header in the file.
func readHeader(h []byte, avail int64) (crc uint32, n int, err error) {
	crc = binary.BigEndian.Uint32(h)
	size := binary.BigEndian.Uint32(h[4:])
	if size < fixedBody || size > maxBody || int64(size) > avail {
		return 0, 0, fmt.Errorf("%w: body length %d with %d bytes left", errTorn, size, avail)
	}
	return crc, int(size), nil
}

// decodeBody decodes a record body whose checksum is crc. Data and ext
// alias body.
func decodeBody(body []byte, crc uint32) (record, error) {
	var r record
	if crc32.Checksum(body, castagnoli) != crc {
		return r, fmt.Errorf("%w: checksum mismatch", errTorn)
	}
	if len(body) < fixedBody {
		return r, fmt.Errorf("%w: body of %d bytes", errTorn, len(body))
	}
	r.kind = body[0]
	r.group = binary.BigEndian.Uint32(body[1:])
	r.index = binary.BigEndian.Uint64(body[5:])
	rest := body[fixedBody:]
	switch r.kind {
	case kindCompact, kindTruncate, kindReset, kindBatch:
		if len(rest) != 0 {
			return r, fmt.Errorf("%w: instruction with %d trailing bytes", errTorn, len(rest))
		}
		return r, nil
	case kindEntry:
	default:
		return r, fmt.Errorf("%w: unknown record kind %d", errTorn, r.kind)
	}
	if len(rest) < fixedEntry {
		return r, fmt.Errorf("%w: entry of %d bytes", errTorn, len(body))
	}
	r.term = binary.BigEndian.Uint64(rest)
	r.typ = raft.LogType(rest[8])
	r.appendedAt = int64(binary.BigEndian.Uint64(rest[9:]))
	rest = rest[fixedEntry:]
	var ok bool
	if r.data, rest, ok = field(rest); !ok {
		return r, fmt.Errorf("%w: entry data", errTorn)
	}
	if r.ext, rest, ok = field(rest); !ok {
		return r, fmt.Errorf("%w: entry extensions", errTorn)
	}
	if len(rest) != 0 {
		return r, fmt.Errorf("%w: entry with %d trailing bytes", errTorn, len(rest))
	}
	return r, nil
}

// field reads a uvarint length and that many bytes.
func field(b []byte) (f, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	return b[k : k+int(n)], b[k+int(n):], true
}

// toLog fills l from an entry record, copying its bytes (the record's
// buffer is reused).
func (r *record) toLog(l *raft.Log) {
	l.Index = r.index
	l.Term = r.term
	l.Type = r.typ
	l.Data = clone(r.data)
	l.Extensions = clone(r.ext)
	l.AppendedAt = time.Time{}
	if r.appendedAt != 0 {
		l.AppendedAt = time.Unix(0, r.appendedAt)
	}
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
