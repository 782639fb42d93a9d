package cluster

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/e1158ecb/taskstore/cluster/nodelog"
)

func oldStore(t *testing.T, path string, first, last uint64) *raftboltdb.BoltStore {
	t.Helper()
	s, err := raftboltdb.New(raftboltdb.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	for i := first; i <= last; i++ {
		if err := s.StoreLog(&raft.Log{Index: i, Term: 3, Type: raft.LogCommand, Data: []byte(fmt.Sprint("cmd", i))}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func span(t *testing.T, s raft.LogStore) [2]uint64 {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return [2]uint64{f, l}
}

// A data directory from before the node log keeps each shard's entries in
// its raft.db: they move to the node log, also when a crash cut an earlier
// move short, and leave the old file.
func TestAdoptLogMovesAnOldDirectorysEntries(t *testing.T) {
	for _, tc := range []struct {
		name  string
		moved uint64 // entries the node log already has from a cut-short move
	}{{"first start", 0}, {"after a crash mid-move", 700}, {"after a crash before the old file was emptied", 1200}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			old := oldStore(t, filepath.Join(dir, "raft.db"), 11, 1200)
			defer old.Close()
			nl, err := nodelog.Open(filepath.Join(dir, "raftlog"), nodelog.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer nl.Close()
			g := nl.Group(5)
			for i := uint64(11); i <= tc.moved; i++ {
				var e raft.Log
				old.GetLog(i, &e)
				if err := g.StoreLog(&e); err != nil {
					t.Fatal(err)
				}
			}
			if err := adoptLog(old, g, false, slog.Default()); err != nil {
				t.Fatal(err)
			}
			if got := span(t, g); got != [2]uint64{11, 1200} {
				t.Fatalf("node log holds %v, want [11 1200]", got)
			}
			for _, i := range []uint64{11, 600, 701, 1200} {
				var e raft.Log
				if err := g.GetLog(i, &e); err != nil || string(e.Data) != fmt.Sprint("cmd", i) || e.Term != 3 {
					t.Fatalf("entry %d: %+v, %v", i, e, err)
				}
			}
			if got := span(t, old); got != [2]uint64{0, 0} {
				t.Fatalf("old raft.db still holds %v after the move", got)
			}
		})
	}
}

// A replica whose directory is new has no entries: what the node log holds
// for its shard is from a replica deleted before the node log heard of it.
func TestAdoptLogDropsADeletedReplicasEntries(t *testing.T) {
	dir := t.TempDir()
	nl, err := nodelog.Open(filepath.Join(dir, "raftlog"), nodelog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	g := nl.Group(2)
	g.StoreLogs([]*raft.Log{{Index: 1, Term: 1}, {Index: 2, Term: 1}})
	fresh := oldStore(t, filepath.Join(dir, "raft.db"), 1, 0)
	defer fresh.Close()
	if err := adoptLog(fresh, g, true, slog.Default()); err != nil {
		t.Fatal(err)
	}
	if got := span(t, g); got != [2]uint64{0, 0} {
		t.Fatalf("node log holds %v for a new replica, want nothing", got)
	}
}
