package nodelog

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// writeBytes is the process's write_bytes from /proc/self/io: bytes it
// caused to be written to storage (-1 when unknown).
func writeBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		var v int64
		if _, err := fmt.Sscanf(string(line), "write_bytes: %d", &v); err == nil {
			return v
		}
	}
	return -1
}

// Appends into a zero-filled segment must cost a page or so of writeback
// per fdatasync, not the size of the fill's writes: the page cache sizes
// folios by the write that creates them, and a fill in 1 MiB writes made
// every small append write back a whole MiB (zeroFill).
func TestAppendsIntoAZeroFilledSegmentWriteBackLittle(t *testing.T) {
	if writeBytes(t) < 0 {
		t.Skip("no /proc/self/io")
	}
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "seg"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := zeroFill(f, 0, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	rec := bytes.Repeat([]byte{1}, 230)
	const n = 300
	before := writeBytes(t)
	for i := 0; i < n; i++ {
		if _, err := f.WriteAt(rec, int64(i*len(rec))); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	per := (writeBytes(t) - before) / n
	t.Logf("%d bytes written back per 230-byte append and fdatasync", per)
	if per > 64<<10 {
		t.Fatalf("%d bytes written back per small append: the fill's folios are too large", per)
	}
}
