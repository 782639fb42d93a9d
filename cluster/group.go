package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// group is one Raft instance with its stores: a raft-boltdb log (fsync on),
// file snapshots, and a network transport over the node's mux.
type group struct {
	id     uint32
	dir    string
	raft   *raft.Raft
	store  *raftboltdb.BoltStore
	trans  *raft.NetworkTransport
	stream *streamLayer
	log    *slog.Logger
}

// groupDir is where a group keeps its files under the node's data directory.
func groupDir(dataDir string, id uint32) string {
	if id == MetaGroupID {
		return filepath.Join(dataDir, "meta")
	}
	return filepath.Join(dataDir, "shards", fmt.Sprint(id))
}

// logCacheEntries is how many recent log entries a group keeps in memory.
// Entries hold whole commands (values up to 1 MiB), so it stays modest: a
// burst beyond it reads from bolt as before.
const logCacheEntries = 128

// noSync must stay false: an acknowledged write is fsynced on a majority.
// A test guards it.
const noSync = false

func openGroup(id uint32, dataDir, localID string, fsm raft.FSM, mux *Mux, t Tuning, log *slog.Logger) (*group, error) {
	dir := groupDir(dataDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"), NoSync: noSync})
	if err != nil {
		return nil, fmt.Errorf("group %d: open log store: %w", id, err)
	}
	hlog := newHCLog(log, slog.LevelWarn)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hlog)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("group %d: open snapshot store: %w", id, err)
	}
	stream, err := mux.streamLayer(id)
	if err != nil {
		store.Close()
		return nil, err
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  stream,
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  hlog,
	})
	// The cache keeps the newest entries in memory, so that replicating
	// them to followers and applying them does not read them back from
	// bolt (msgpack decoding included): ~15% of a loaded node's CPU in a
	// profile of 32 concurrent inserters (docs/performance.md).
	logs, err := raft.NewLogCache(logCacheEntries, store)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("group %d: log cache: %w", id, err)
	}
	conf := t.raftConfig(localID)
	conf.Logger = hlog
	r, err := raft.NewRaft(conf, fsm, logs, store, snaps, serialTransport{trans})
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("group %d: start raft: %w", id, err)
	}
	return &group{id: id, dir: dir, raft: r, store: store, trans: trans, stream: stream, log: log}, nil
}

// bootstrap sets the group's first configuration unless it has state already.
func (g *group) bootstrap(servers []raft.Server) error {
	err := g.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return nil
	}
	return err
}

// drainTimeout bounds how long shutdown waits for the transport's
// connection handlers before closing the log store.
const drainTimeout = 5 * time.Second

func (g *group) shutdown() error {
	err := g.raft.Shutdown().Error()
	g.trans.Close()
	// Handlers of accepted connections may still be inside a heartbeat
	// that writes the store (see streamLayer.drain).
	if !g.stream.drain(drainTimeout) {
		g.log.Warn("raft connection handlers still running after shutdown; closing the log store anyway", "shard", g.id, "waited", drainTimeout)
	}
	if cerr := g.store.Close(); err == nil {
		err = cerr
	}
	return err
}
