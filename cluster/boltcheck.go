package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
)

// ErrBoltDamaged: a raft-boltdb file that bbolt must not open.
var ErrBoltDamaged = errors.New("damaged raft.db")

// bbolt's file layout (go.etcd.io/bbolt, internal/common): pages 0 and 1
// are meta pages, each a 16-byte page header followed by the meta record.
const (
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	boltPageHeader  = 16
	boltMetaSumSize = 56 // the meta record's bytes that its checksum covers
	boltFreelistFlg = 0x10
	boltNoFreelist  = ^uint64(0)
)

// boltMeta is the part of a bbolt meta page that says where the file's
// pages end.
type boltMeta struct {
	pageSize uint32
	root     uint64 // the root bucket's page
	freelist uint64 // the freelist's page, or boltNoFreelist
	pgid     uint64 // high water mark: every page in use is below it
	txid     uint64
}

// parseBoltMeta reads a meta record (after the page header) and checks its
// magic, version and checksum as bbolt does (Meta.Validate).
func parseBoltMeta(b []byte) (boltMeta, bool) {
	if len(b) < boltMetaSumSize+8 {
		return boltMeta{}, false
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != boltMagic || le.Uint32(b[4:]) != boltVersion {
		return boltMeta{}, false
	}
	h := fnv.New64a()
	h.Write(b[:boltMetaSumSize])
	if h.Sum64() != le.Uint64(b[boltMetaSumSize:]) {
		return boltMeta{}, false
	}
	return boltMeta{
		pageSize: le.Uint32(b[8:]),
		root:     le.Uint64(b[16:]),
		freelist: le.Uint64(b[32:]),
		pgid:     le.Uint64(b[40:]),
		txid:     le.Uint64(b[48:]),
	}, true
}

// checkBoltFile refuses a raft-boltdb file that bbolt would read past the
// end of. bbolt maps the file into memory and takes its meta page's word
// for where the pages end: in a file cut short (a torn copy, a restore
// gone wrong) it reads the freelist or the root from beyond the end, and
// the kernel answers with SIGBUS, which kills the process and cannot be
// recovered. So the meta pages are read with plain reads first and the
// file's size checked against the newest valid one, as bbolt picks it.
// bbolt's own consistency check (Tx.Check) is not used: it walks the pages
// on a goroutine of its own, where a panic on a damaged page could not be
// recovered either. Damage inside the file's length is left to bbolt,
// whose panics openBolt turns into errors. A missing or empty file is
// fine: bbolt creates it.
func checkBoltFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	size := info.Size()
	if size == 0 {
		return nil
	}
	read := func(off int64) []byte {
		buf := make([]byte, boltPageHeader+boltMetaSumSize+8)
		if n, _ := f.ReadAt(buf, off); n < len(buf) {
			return nil
		}
		return buf[boltPageHeader:]
	}
	var metas []boltMeta
	m0, ok0 := parseBoltMeta(read(0))
	if ok0 {
		metas = append(metas, m0)
	}
	// The second meta page starts one page in; like bbolt, try the page
	// sizes it supports when the first meta does not say.
	sizes := []int64{int64(m0.pageSize)}
	if !ok0 {
		sizes = sizes[:0]
		for i := range 15 {
			sizes = append(sizes, 1024<<i)
		}
	}
	for _, ps := range sizes {
		if ps <= 0 || ps >= size {
			continue
		}
		if m1, ok := parseBoltMeta(read(ps)); ok && int64(m1.pageSize) == ps {
			metas = append(metas, m1)
			break
		}
	}
	if len(metas) == 0 {
		return fmt.Errorf("%w: %s (%d bytes) has no valid bbolt meta page", ErrBoltDamaged, path, size)
	}
	m := metas[0]
	if len(metas) == 2 && metas[1].txid > m.txid {
		m = metas[1]
	}
	ps := uint64(m.pageSize)
	if ps < 512 || ps&(ps-1) != 0 {
		return fmt.Errorf("%w: %s: page size %d", ErrBoltDamaged, path, ps)
	}
	if m.pgid < 2 || m.pgid > uint64(size)/ps {
		return fmt.Errorf("%w: %s is cut short: %d bytes, but its meta page (transaction %d) says its %d pages of %d bytes take %d",
			ErrBoltDamaged, path, size, m.txid, m.pgid, ps, m.pgid*ps)
	}
	if m.root >= m.pgid || (m.freelist != boltNoFreelist && m.freelist >= m.pgid) {
		return fmt.Errorf("%w: %s: its meta page points past its %d pages (root %d, freelist %d)", ErrBoltDamaged, path, m.pgid, m.root, m.freelist)
	}
	if m.freelist != boltNoFreelist {
		// The freelist page may run on over further pages (its overflow):
		// bbolt reads them all when it opens the file.
		hdr := make([]byte, boltPageHeader)
		if _, err := f.ReadAt(hdr, int64(m.freelist*ps)); err != nil {
			return fmt.Errorf("%w: %s: read freelist page %d: %v", ErrBoltDamaged, path, m.freelist, err)
		}
		flags := binary.LittleEndian.Uint16(hdr[8:])
		overflow := uint64(binary.LittleEndian.Uint32(hdr[12:]))
		if flags&boltFreelistFlg == 0 || m.freelist+overflow >= m.pgid {
			return fmt.Errorf("%w: %s: page %d is not the freelist its meta page names", ErrBoltDamaged, path, m.freelist)
		}
	}
	return nil
}
