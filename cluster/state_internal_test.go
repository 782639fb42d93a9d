package cluster

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// An empty Config.StateStore means DefaultStateStore, as Config says: it
// opened the disk engine whatever the default was.
func TestEmptyStateStoreIsTheDefault(t *testing.T) {
	for _, tc := range []struct {
		store      string
		wantEngine bool
	}{
		{"", DefaultStateStore == StateOnDisk},
		{StateInMemory, false},
		{StateOnDisk, true},
	} {
		dir := t.TempDir()
		db, err := openState(Config{DataDir: dir, StateStore: tc.store}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("store %q: %v", tc.store, err)
		}
		if db != nil {
			db.Close()
		}
		_, statErr := os.Stat(filepath.Join(dir, "state"))
		if got := db != nil; got != tc.wantEngine || (statErr == nil) != tc.wantEngine {
			t.Errorf("store %q: engine opened %v (directory made: %v), want %v", tc.store, got, statErr == nil, tc.wantEngine)
		}
	}
}
