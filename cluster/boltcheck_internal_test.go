package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

// A raft.db cut short used to kill the process: bbolt maps the file and
// reads its freelist from beyond the end (SIGBUS, not a panic). openBolt
// must refuse it with an error instead, and still open an intact file.
func TestOpenBoltRefusesAFileCutShort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	s, err := openBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 200; i++ {
		if err := s.StoreLog(&raft.Log{Index: i, Term: 7, Data: make([]byte, 2000)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := checkBoltFile(path); err != nil {
		t.Fatalf("intact file: %v", err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{info.Size() / 2, 6000, 100} {
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
		s, err := openBolt(path)
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, ErrBoltDamaged) {
			t.Fatalf("raft.db of %d bytes cut to %d: %v, want ErrBoltDamaged", info.Size(), size, err)
		}
		t.Logf("cut to %d: %v", size, err)
	}
}
