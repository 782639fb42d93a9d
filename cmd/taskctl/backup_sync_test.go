package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestBackgroundSyncWritesEverything: the file a backup writes through
// backgroundSync holds every byte in order, across the background syncs,
// and a sync's error reaches stop.
func TestBackgroundSyncWritesEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.tsb")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	s := newBackgroundSync(f)
	var want bytes.Buffer
	chunk := make([]byte, 1<<20+13)
	for i := 0; want.Len() < 3*syncEvery; i++ {
		for j := range chunk {
			chunk[j] = byte(i + j)
		}
		if _, err := s.Write(chunk); err != nil {
			t.Fatal(err)
		}
		want.Write(chunk)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("the file holds %d bytes, not the %d written", len(got), want.Len())
	}

}
