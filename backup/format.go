package backup

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The file's layout (DESIGN.md has the reasons):
//
//	file     = magic version part* manifest end
//	magic    = "TSBACKUP"                 8 bytes
//	version  = uint32, big endian         Format
//	part     = 'P' kind id chunk* 0x00 length crc
//	kind     = 'M' (the cluster map) | 'S' (a shard's state) | 'J' (the manifest)
//	id       = uvarint                    the shard (0 for the map and the manifest)
//	chunk    = uvarint(n), 0 < n <= MaxChunk, then n bytes of the part's data
//	length   = uint64, big endian         the part's data bytes
//	crc      = uint32, big endian         CRC-32C of the part's data
//	end      = 'E' uint32                 CRC-32C of every byte before the 'E'
//
// Nothing may follow the end. The manifest is the last part because only
// then are the shards' indexes, counts and checksums known; a reader trusts
// nothing it read until the end checked out.
const (
	magic = "TSBACKUP"
	// Format is the version of the layout this package writes and reads.
	Format = 1
	// MaxChunk bounds one chunk, so that a damaged length cannot make a
	// reader allocate more than the file holds.
	MaxChunk = 4 << 20
	// maxSmallPart bounds the parts read whole (the map, the manifest).
	maxSmallPart = 64 << 20
)

// Kind says what a part holds.
type Kind byte

// The kinds of part.
const (
	KindMap      Kind = 'M'
	KindShard    Kind = 'S'
	KindManifest Kind = 'J'
)

// ErrCorrupt is wrapped by every error about a file that is not a whole,
// intact backup this version can read.
var ErrCorrupt = errors.New("not an intact backup")

// CorruptError names the part of the file that is wrong.
type CorruptError struct {
	Part   string // "header", "cluster map", "shard 3", "manifest", "end"
	Offset int64  // the file offset where reading it failed
	Err    error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("backup damaged or truncated: %s (at byte %d): %v", e.Part, e.Offset, e.Err)
}

func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Manifest describes a backup: what it holds and where it came from.
type Manifest struct {
	Format    int       `json:"format"`
	ClusterID string    `json:"cluster_id"`
	Version   string    `json:"taskstore_version,omitempty"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	// MapEpoch is the cluster map's epoch (the meta group's index of its
	// last change) when the backup began; the map did not change until it
	// ended.
	MapEpoch          uint64      `json:"map_epoch"`
	ReplicationFactor uint32      `json:"replication_factor"`
	Slots             int         `json:"slots"`
	Map               PartInfo    `json:"map"`
	Shards            []ShardInfo `json:"shards"`
}

// PartInfo is a part's size and checksum.
type PartInfo struct {
	Bytes  uint64 `json:"bytes"`
	CRC32C uint32 `json:"crc32c"`
}

// ShardInfo is one shard's part.
type ShardInfo struct {
	ID uint32 `json:"id"`
	// Index is the Raft index of the shard's log the state is a copy of:
	// every entry up to it is in, none after it.
	Index uint64 `json:"index"`
	Tasks uint64 `json:"tasks"`
	// Slots are the hash slots the shard served, as ranges ("0-3,8").
	Slots string `json:"slots"`
	// Node is the replica the state was copied from.
	Node string `json:"node,omitempty"`
	PartInfo
}

// Tasks is the number of tasks over every shard.
func (m *Manifest) Tasks() uint64 {
	var n uint64
	for _, s := range m.Shards {
		n += s.Tasks
	}
	return n
}

// Bytes is the size of the state over every part.
func (m *Manifest) Bytes() uint64 {
	n := m.Map.Bytes
	for _, s := range m.Shards {
		n += s.Bytes
	}
	return n
}

// Shard returns the shard's entry, or nil.
func (m *Manifest) Shard(id uint32) *ShardInfo {
	for i := range m.Shards {
		if m.Shards[i].ID == id {
			return &m.Shards[i]
		}
	}
	return nil
}

// SlotRanges writes the slots a shard owns in table as ranges: "0-3,8".
func SlotRanges(table []uint32, shard uint32) string {
	var b strings.Builder
	for i := 0; i < len(table); i++ {
		if table[i] != shard {
			continue
		}
		j := i
		for j+1 < len(table) && table[j+1] == shard {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(j))
		}
		i = j
	}
	return b.String()
}

func partName(k Kind, id uint32) string {
	switch k {
	case KindMap:
		return "cluster map"
	case KindShard:
		return fmt.Sprintf("shard %d", id)
	case KindManifest:
		return "manifest"
	}
	return fmt.Sprintf("part of unknown kind 0x%02x", byte(k))
}

// Writer writes a backup file: the map, the shards, then Finish.
type Writer struct {
	w     *bufio.Writer
	file  hash.Hash32 // every byte written
	n     int64
	parts []writtenPart
	open  bool
	err   error
}

type writtenPart struct {
	kind Kind
	id   uint32
	PartInfo
}

// NewWriter writes the file's header to w.
func NewWriter(w io.Writer) (*Writer, error) {
	bw := &Writer{w: bufio.NewWriterSize(w, 1<<20), file: crc32.New(castagnoli)}
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], Format)
	bw.write([]byte(magic))
	bw.write(v[:])
	return bw, bw.err
}

func (w *Writer) write(p []byte) {
	if w.err != nil {
		return
	}
	w.file.Write(p)
	if len(p) >= w.w.Available() && w.w.Buffered() > 0 {
		// A chunk of a MiB: bufio writes it straight through once its
		// buffer is empty, instead of copying it in.
		if w.err = w.w.Flush(); w.err != nil {
			return
		}
	}
	var n int
	n, w.err = w.w.Write(p)
	w.n += int64(n)
}

// Written is the number of bytes written so far.
func (w *Writer) Written() int64 { return w.n }

// Part begins a part; write its data to the returned writer and Close it
// before the next part.
func (w *Writer) Part(k Kind, id uint32) (*PartWriter, error) {
	if w.open {
		return nil, errors.New("backup: a part is still open")
	}
	if k == KindManifest {
		return nil, errors.New("backup: the manifest is written by Finish")
	}
	var hdr [2 + binary.MaxVarintLen32]byte
	hdr[0], hdr[1] = 'P', byte(k)
	n := binary.PutUvarint(hdr[2:], uint64(id))
	w.write(hdr[:2+n])
	w.open = true
	return &PartWriter{w: w, kind: k, id: id, crc: crc32.New(castagnoli)}, w.err
}

// PartWriter writes one part's data in chunks.
type PartWriter struct {
	w     *Writer
	kind  Kind
	id    uint32
	crc   hash.Hash32
	bytes uint64
}

func (p *PartWriter) Write(b []byte) (int, error) {
	written := len(b)
	var lb [binary.MaxVarintLen64]byte
	for len(b) > 0 {
		c := b[:min(len(b), MaxChunk)]
		b = b[len(c):]
		p.w.write(lb[:binary.PutUvarint(lb[:], uint64(len(c)))])
		p.w.write(c)
		p.crc.Write(c)
		p.bytes += uint64(len(c))
	}
	if p.w.err != nil {
		return 0, p.w.err
	}
	return written, nil
}

// Close ends the part and returns its size and checksum.
func (p *PartWriter) Close() (PartInfo, error) {
	info := PartInfo{Bytes: p.bytes, CRC32C: p.crc.Sum32()}
	var t [1 + 8 + 4]byte
	binary.BigEndian.PutUint64(t[1:], info.Bytes)
	binary.BigEndian.PutUint32(t[9:], info.CRC32C)
	p.w.write(t[:])
	p.w.open = false
	p.w.parts = append(p.w.parts, writtenPart{kind: p.kind, id: p.id, PartInfo: info})
	return info, p.w.err
}

// Finish fills in the manifest's sizes and checksums from the parts
// written, checks that it names exactly them, writes it and the end, and
// flushes. The file is complete once it returns nil.
func (w *Writer) Finish(m *Manifest) error {
	if w.open {
		return errors.New("backup: a part is still open")
	}
	m.Format = Format
	for _, p := range w.parts {
		switch p.kind {
		case KindMap:
			m.Map = p.PartInfo
		case KindShard:
			s := m.Shard(p.id)
			if s == nil {
				return fmt.Errorf("backup: the manifest does not name shard %d", p.id)
			}
			s.PartInfo = p.PartInfo
		}
	}
	if err := checkManifest(m, w.parts); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	w.write([]byte{'P', byte(KindManifest), 0})
	w.open = true
	pw := &PartWriter{w: w, kind: KindManifest, crc: crc32.New(castagnoli)}
	if _, err := pw.Write(data); err != nil {
		return err
	}
	if _, err := pw.Close(); err != nil {
		return err
	}
	var end [5]byte
	end[0] = 'E'
	binary.BigEndian.PutUint32(end[1:], w.file.Sum32())
	w.write(end[:])
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

// checkManifest checks that m describes exactly the parts: one map first,
// then each shard once, in the manifest's order, with the same sizes and
// checksums.
func checkManifest(m *Manifest, parts []writtenPart) error {
	if m.Format != Format {
		return fmt.Errorf("format %d, this version reads %d", m.Format, Format)
	}
	if m.ClusterID == "" {
		return errors.New("no cluster id")
	}
	if len(parts) == 0 || parts[0].kind != KindMap {
		return errors.New("the cluster map is not the first part")
	}
	if parts[0].PartInfo != m.Map {
		return fmt.Errorf("the cluster map's part (%d bytes, crc %08x) is not the manifest's (%d bytes, crc %08x)",
			parts[0].Bytes, parts[0].CRC32C, m.Map.Bytes, m.Map.CRC32C)
	}
	shards := parts[1:]
	if len(shards) != len(m.Shards) {
		return fmt.Errorf("%d shard parts, the manifest names %d shards", len(shards), len(m.Shards))
	}
	seen := map[uint32]bool{}
	for i, p := range shards {
		want := m.Shards[i]
		if p.kind != KindShard {
			return fmt.Errorf("part %d is a %s, not a shard", i+2, partName(p.kind, p.id))
		}
		if p.id != want.ID || seen[p.id] || p.id == 0 {
			return fmt.Errorf("part %d is shard %d, the manifest names shard %d there", i+2, p.id, want.ID)
		}
		seen[p.id] = true
		if p.PartInfo != want.PartInfo {
			return fmt.Errorf("shard %d's part (%d bytes, crc %08x) is not the manifest's (%d bytes, crc %08x)",
				p.id, p.Bytes, p.CRC32C, want.Bytes, want.CRC32C)
		}
	}
	return nil
}

// Reader reads a backup file part by part, checking every checksum.
type Reader struct {
	r      *countingReader
	parts  []writtenPart
	cur    *Part
	done   bool
	m      *Manifest
	header bool
}

type countingReader struct {
	r    *bufio.Reader
	file hash.Hash32
	n    int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.file.Write(p[:n])
	c.n += int64(n)
	return n, err
}

func (c *countingReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.file.Write([]byte{b})
		c.n++
	}
	return b, err
}

// NewReader reads a backup from r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: &countingReader{r: bufio.NewReaderSize(r, 1<<20), file: crc32.New(castagnoli)}}
}

func (r *Reader) corrupt(part string, err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF // the file ended inside what should be there
	}
	return &CorruptError{Part: part, Offset: r.r.n, Err: err}
}

// Part is one part of the file being read. Read returns its data; the
// last Read (io.EOF) checks its length and checksum.
type Part struct {
	Kind Kind
	ID   uint32
	r    *Reader
	crc  hash.Hash32
	n    uint64
	left uint64 // of the current chunk
	end  bool
	err  error
}

// Name is how errors and progress name the part ("shard 3").
func (p *Part) Name() string { return partName(p.Kind, p.ID) }

func (p *Part) Read(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	if p.end {
		return 0, io.EOF
	}
	for p.left == 0 {
		n, err := binary.ReadUvarint(p.r.r)
		if err != nil {
			p.err = p.r.corrupt(p.Name(), fmt.Errorf("chunk length: %w", err))
			return 0, p.err
		}
		if n == 0 {
			p.err = p.finish()
			if p.err != nil {
				return 0, p.err
			}
			p.end = true
			return 0, io.EOF
		}
		if n > MaxChunk {
			p.err = p.r.corrupt(p.Name(), fmt.Errorf("a chunk of %d bytes (at most %d)", n, MaxChunk))
			return 0, p.err
		}
		p.left = n
	}
	if uint64(len(b)) > p.left {
		b = b[:p.left]
	}
	n, err := p.r.r.Read(b)
	p.crc.Write(b[:n])
	p.n += uint64(n)
	p.left -= uint64(n)
	if err != nil && !(err == io.EOF && n > 0) {
		p.err = p.r.corrupt(p.Name(), err)
		return n, p.err
	}
	return n, nil
}

// finish reads the part's trailer and checks it.
func (p *Part) finish() error {
	var t [12]byte
	if _, err := io.ReadFull(p.r.r, t[:]); err != nil {
		return p.r.corrupt(p.Name(), fmt.Errorf("trailer: %w", err))
	}
	length, sum := binary.BigEndian.Uint64(t[:8]), binary.BigEndian.Uint32(t[8:])
	if length != p.n {
		return p.r.corrupt(p.Name(), fmt.Errorf("%d bytes read, the trailer says %d", p.n, length))
	}
	if got := p.crc.Sum32(); got != sum {
		return p.r.corrupt(p.Name(), fmt.Errorf("checksum %08x, the trailer says %08x", got, sum))
	}
	p.r.parts = append(p.r.parts, writtenPart{kind: p.Kind, id: p.ID, PartInfo: PartInfo{Bytes: length, CRC32C: sum}})
	return nil
}

// Next returns the next part of the file (the map, then each shard), after
// reading to the end of the current one. After the last shard it reads
// and checks the manifest and the end, and returns io.EOF: only then is
// the whole file known to be intact, and Manifest returns what it holds.
func (r *Reader) Next() (*Part, error) {
	if r.done {
		return nil, io.EOF
	}
	if !r.header {
		var h [12]byte
		if _, err := io.ReadFull(r.r, h[:]); err != nil {
			return nil, r.corrupt("header", err)
		}
		if string(h[:8]) != magic {
			return nil, r.corrupt("header", errors.New("not a Taskstore backup (no TSBACKUP magic)"))
		}
		if v := binary.BigEndian.Uint32(h[8:]); v != Format {
			return nil, r.corrupt("header", fmt.Errorf("format %d, this version reads format %d", v, Format))
		}
		r.header = true
	}
	if r.cur != nil {
		if _, err := io.Copy(io.Discard, r.cur); err != nil {
			return nil, err
		}
		r.cur = nil
	}
	b, err := r.r.ReadByte()
	if err != nil {
		return nil, r.corrupt(r.nextName(), err)
	}
	if b != 'P' {
		return nil, r.corrupt(r.nextName(), fmt.Errorf("byte 0x%02x where a part begins", b))
	}
	k, err := r.r.ReadByte()
	if err != nil {
		return nil, r.corrupt(r.nextName(), err)
	}
	id, err := binary.ReadUvarint(r.r)
	if err != nil || id > 1<<32-1 {
		return nil, r.corrupt(r.nextName(), fmt.Errorf("part id: %v", err))
	}
	p := &Part{Kind: Kind(k), ID: uint32(id), r: r, crc: crc32.New(castagnoli)}
	switch p.Kind {
	case KindMap, KindShard:
		r.cur = p
		return p, nil
	case KindManifest:
		return nil, r.readManifest(p)
	}
	return nil, r.corrupt(p.Name(), errors.New("unknown part kind"))
}

// nextName names the part expected next, for an error.
func (r *Reader) nextName() string {
	if len(r.parts) == 0 {
		return "cluster map"
	}
	return fmt.Sprintf("the part after %s", partName(r.parts[len(r.parts)-1].kind, r.parts[len(r.parts)-1].id))
}

func (r *Reader) readManifest(p *Part) error {
	data, err := io.ReadAll(io.LimitReader(p, maxSmallPart))
	if err != nil {
		return err
	}
	if !p.end {
		return r.corrupt("manifest", fmt.Errorf("longer than %d bytes", maxSmallPart))
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return r.corrupt("manifest", err)
	}
	sum := r.r.file.Sum32()
	var end [5]byte
	if _, err := io.ReadFull(r.r, end[:]); err != nil {
		return r.corrupt("end", err)
	}
	if end[0] != 'E' {
		return r.corrupt("end", fmt.Errorf("byte 0x%02x where the end begins", end[0]))
	}
	if got := binary.BigEndian.Uint32(end[1:]); got != sum {
		return r.corrupt("end", fmt.Errorf("file checksum %08x, the end says %08x", sum, got))
	}
	var extra [1]byte
	if n, _ := io.ReadFull(r.r, extra[:]); n > 0 {
		return r.corrupt("end", errors.New("bytes after the end"))
	}
	// The manifest's own part is not among those it describes.
	if err := checkManifest(&m, r.parts[:len(r.parts)-1]); err != nil {
		return r.corrupt("manifest", err)
	}
	r.m, r.done = &m, true
	return io.EOF
}

// Manifest is the file's manifest, once Next returned io.EOF.
func (r *Reader) Manifest() *Manifest { return r.m }

// Verify reads a whole backup, checking every part, the manifest and the
// end, and returns the manifest. progress (may be nil) is called at the
// start of each part.
func Verify(rd io.Reader, progress func(part string)) (*Manifest, error) {
	r := NewReader(rd)
	for {
		p, err := r.Next()
		if errors.Is(err, io.EOF) {
			return r.Manifest(), nil
		}
		if err != nil {
			return nil, err
		}
		if progress != nil {
			progress(p.Name())
		}
	}
}

// ShardIDs lists the manifest's shards in order.
func (m *Manifest) ShardIDs() []uint32 {
	ids := make([]uint32, 0, len(m.Shards))
	for _, s := range m.Shards {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return ids
}
