package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/ondisk"
)

// Where a data shard's state machine keeps its tasks (Config.StateStore).
const (
	// StateOnDisk keeps the tasks, sessions and key reservations of every
	// data shard hosted here in one Pebble engine per node
	// (<data>/state), memory holding a record per queue; the Raft log is
	// the durable record, the engine is flushed before raft truncates it
	// (fsm/ondisk/DESIGN.md, cluster/DESIGN.md "The state on disk").
	StateOnDisk = "disk"
	// StateInMemory keeps them in memory, rebuilt at start from the
	// latest snapshot and the log after it.
	StateInMemory = "memory"
)

// DefaultStateStore is Config.StateStore when empty. Memory, for now: on
// disk a 3-node cluster moves 0.79-1.03x the claims+commits it moves in
// memory via a proxy and 0.72-0.98x its single inserts, not yet 0.9x in
// every round (docs/performance.md, "What the numbers say").
// --state disk is for queues larger than memory until that cost comes
// down; memory is bounded by the node's budget either way (memory.go).
const DefaultStateStore = StateInMemory

// stateCacheBytes is the engine's block cache without a memory limit
// (engineSizes): what a claim reads most (the heads of the claim indexes,
// the queue records) stays in it, and memory does not grow with the tasks.
const stateCacheBytes = 128 << 20

// stateDir is where the node's state engine lives under its data directory.
func stateDir(dataDir string) string { return filepath.Join(dataDir, "state") }

// openState opens the node's state engine (logging to log), or returns nil when the shards
// keep their state in memory. A node that ran with the state on disk
// before and now runs in memory keeps the engine's directory (its next
// start on disk installs the latest snapshot over it, or skips to it).
func openState(cfg Config, log *slog.Logger) (*pebble.DB, error) {
	if stateInMemory(cfg) {
		return nil, nil
	}
	return openEngine(stateDir(cfg.DataDir), cfg.MemoryLimit, log)
}

// stateInMemory reports whether the node's shards keep their state in
// memory (Config.StateStore, DefaultStateStore when empty).
func stateInMemory(cfg Config) bool {
	store := cfg.StateStore
	if store == "" {
		store = DefaultStateStore
	}
	return store == StateInMemory
}

// openEngine opens the state engine in dir (logging to log), its caches
// sized by the node's memory limit (engineSizes).
func openEngine(dir string, memoryLimit int64, log *slog.Logger) (*pebble.DB, error) {
	cache, memtable := engineSizes(memoryLimit)
	o := ondisk.EngineOptions(cache)
	o.MemTableSize = uint64(memtable)
	o.Logger = pebbleLogger{log}
	db, err := pebble.Open(dir, o)
	if err != nil {
		return nil, fmt.Errorf("open the state engine in %s: %w", dir, err)
	}
	return db, nil
}

// stateStore is where the node's data shards keep their state: the engine
// when they keep it on disk, else nothing (in memory), and the engine a node
// now in memory left when it ran on disk, opened when a marker needs it.
type stateStore struct {
	dataDir     string
	memoryLimit int64
	log         *slog.Logger
	// db is the node's state engine; nil: the shards keep their state in
	// memory.
	db *pebble.DB
	// old is the engine a node in memory reads a marker's state from
	// (streamFromEngine), opened when first needed.
	oldMu sync.Mutex
	old   *pebble.DB
}

// newMachine makes a shard's state machine: on the engine when the node
// has one, else in memory. A replica with no Raft state yet (a new one,
// or one retired or rebuilt before) drops whatever the engine holds for
// its shard, which belongs to an earlier replica, so that the entries and
// snapshot the leader sends build the state from nothing.
func (st *stateStore) newMachine(id uint32, opts fsm.Options) (*fsm.Machine, error) {
	if st.db == nil {
		opts.MarkerSource = func() (io.ReadCloser, error) { return st.streamFromEngine(id) }
		return fsm.New(opts), nil
	}
	if !hasRaftState(st.dataDir, id) {
		if err := fsm.DropOnDisk(st.db, id); err != nil {
			return nil, err
		}
	}
	opts.MarkerSnapshots = true // markerStore expands them for followers
	return fsm.NewOnDisk(opts, st.db, id)
}

// streamFromEngine streams shard id's state out of the engine a node that
// now runs in memory left when it ran on disk: raft's latest snapshot of
// the shard is then a marker of it (fsm.Options.MarkerSource).
func (st *stateStore) streamFromEngine(id uint32) (io.ReadCloser, error) {
	st.oldMu.Lock()
	defer st.oldMu.Unlock()
	if st.old == nil {
		dir := stateDir(st.dataDir)
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("the state engine %s this node kept with --state disk: %w", dir, err)
		}
		db, err := openEngine(dir, st.memoryLimit, st.log)
		if err != nil {
			return nil, err
		}
		st.old = db
	}
	m, err := fsm.NewOnDisk(fsm.Options{}, st.old, id)
	if err != nil {
		return nil, err
	}
	snap, err := m.FullSnapshot()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		err := snap.Persist(pipeSink{pw})
		snap.Release()
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// pipeSink is a raft.SnapshotSink into a pipe.
type pipeSink struct{ *io.PipeWriter }

func (pipeSink) ID() string      { return "engine" }
func (p pipeSink) Cancel() error { return p.CloseWithError(errors.New("snapshot cancelled")) }

// close closes the engines once every shard is closed.
func (st *stateStore) close() error {
	st.oldMu.Lock()
	if st.old != nil {
		st.old.Close()
		st.old = nil
	}
	st.oldMu.Unlock()
	if st.db == nil {
		return nil
	}
	db := st.db
	st.db = nil
	if err := db.Close(); err != nil {
		return fmt.Errorf("close the state engine: %w", err)
	}
	return nil
}

// drop deletes a closed replica's state from the engine (retired or
// wiped). Were it lost to a crash, the replica's next start would find no
// Raft files and drop it then (newMachine).
func (st *stateStore) drop(id uint32) error {
	if st.db == nil {
		return nil
	}
	return fsm.DropOnDisk(st.db, id)
}

// hasRaftState reports whether a data shard's group directory holds its
// Raft files (raft.db is created when the group first opens).
func hasRaftState(dataDir string, id uint32) bool {
	_, err := os.Stat(filepath.Join(groupDir(dataDir, id), "raft.db"))
	return !errors.Is(err, os.ErrNotExist)
}

// pebbleLogger sends the engine's messages to slog: flushes and
// compactions at DEBUG, its errors (a failed background write: a full or
// failing disk) at ERROR, where an operator must look.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...))
	}
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...))
}

// Fatalf is an error the engine cannot go on from (a corrupt file): the
// process stops, as it does when a shard cannot apply an entry.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log.Error(msg)
	panic("state engine: " + msg)
}
