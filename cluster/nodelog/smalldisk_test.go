package nodelog

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

func statfsFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// A disk with less free space than the segments take up front: a 64 MB
// volume could not start a node, each segment being zero-filled to 64 MiB
// at once. Now a segment is zero-filled as far as a
// quarter of the free space, appends go on past the zeros, and all of it
// reads back after a reopen.
func TestSmallDiskFillsSegmentsInPart(t *testing.T) {
	dir := t.TempDir()
	free := uint64(64 << 10)
	opts := Options{DiskFree: func(string) (uint64, error) { return free, nil }}
	l := open(t, dir, opts)
	info, err := os.Stat(filepath.Join(dir, segName(1)))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() != int64(free/4) {
		t.Fatalf("first segment of %d bytes with %d free, want %d", info.Size(), free, free/4)
	}
	store(t, l.Group(1), 1, 2000, 1) // well past the zeros
	l.Close()
	l = open(t, dir, opts)
	expect(t, l.Group(1), 1, 2000, term1)
}

// The same on a real 64 MB tmpfs, where the node log used to fail at open
// with ENOSPC. Needs the right to mount (root in a container that allows
// it); skipped otherwise.
func TestNodeLogOnA64MBVolume(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	l, err := Open(dir, Options{DiskFree: statfsFree})
	if err != nil {
		t.Fatalf("open on a 64 MB volume: %v", err)
	}
	defer l.Close()
	store(t, l.Group(1), 1, 5000, 1)
	expect(t, l.Group(1), 1, 5000, term1)
}
