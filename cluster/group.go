package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/e1158ecb/taskstore/cluster/nodelog"
	fsmpkg "github.com/e1158ecb/taskstore/fsm"
)

// group is one Raft instance with its stores: its entries in the node's
// shared log (data shards) or in its raft-boltdb file (the meta group), its
// term and vote in that raft-boltdb file (fsync on), file snapshots, and a
// network transport over the node's mux.
type group struct {
	id     uint32
	dir    string
	raft   *raft.Raft
	store  *raftboltdb.BoltStore
	logs   raft.LogStore // store, or the group's part of the node log
	stored *storeHook    // what raft stores its entries through
	trans  *raft.NetworkTransport
	stream *streamLayer
	log    *slog.Logger
	// existing: the group had a term, log entries or a snapshot when it
	// opened (it was bootstrapped or joined before).
	existing bool
	// hold, when set, keeps the replica from voting (vote.go).
	hold *voteHold
	// reloadMu serialises read-modify-writes of raft's reloadable
	// configuration (logbound.go, deadleader.go).
	reloadMu sync.Mutex
	// stopped is closed by shutdown.
	stopped  chan struct{}
	stopOnce sync.Once
}

// groupDir is where a group keeps its files under the node's data directory.
func groupDir(dataDir string, id uint32) string {
	if id == MetaGroupID {
		return filepath.Join(dataDir, "meta")
	}
	return filepath.Join(dataDir, "shards", fmt.Sprint(id))
}

// retiredMark is the file that says this node retired its replica of a
// shard (retireReplicas). A new shard's initial replicas bootstrap its
// group (bootstrapNewShard) only where no such mark is: a node restarting
// replays its copy of the meta log, whose earlier maps still list a shard
// removed since with this node among its initial replicas, and it must
// not bring the shard's group back from them.
//
// The mark holds the epoch of the map under which the replica retired
// (decimal). Only a later map may start the replica again (the map placed
// it here again): an earlier one, restored from the meta group's snapshot
// or replayed at a restart, would bring back a leaderless ghost of a
// removed shard until the node caught up and retired it once more.
func retiredMark(dataDir string, id uint32) string {
	return filepath.Join(dataDir, "shards", fmt.Sprintf("%d.retired", id))
}

// writeRetiredMark records that this node retired its replica of shard id
// under the map of the given epoch.
func writeRetiredMark(dataDir string, id uint32, epoch uint64) error {
	return os.WriteFile(retiredMark(dataDir, id), []byte(strconv.FormatUint(epoch, 10)), 0o644)
}

// retiredEpoch reports whether this node retired its replica of shard id,
// and under which map epoch (0 for a mark written before marks held it).
func retiredEpoch(dataDir string, id uint32) (epoch uint64, retired bool) {
	b, err := os.ReadFile(retiredMark(dataDir, id))
	if err != nil {
		return 0, false
	}
	epoch, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return epoch, true
}

// logCacheEntries is how many recent log entries a group keeps in memory.
// Entries hold whole commands (values up to 1 MiB), so it stays modest: a
// burst beyond it reads from bolt as before.
const logCacheEntries = 128

// noSync must stay false: an acknowledged write is fsynced on a majority.
// A test guards it.
const noSync = false

// openGroup starts a group. shared is the group's part of the node log, or
// nil to keep its entries in its own raft-boltdb file (the meta group).
// markers, when set, is the machine on disk whose snapshots are markers
// (markerStore).
func openGroup(id uint32, dataDir, localID string, fsm raft.FSM, mux *Mux, t Tuning, shared *nodelog.Group, markers *fsmpkg.Machine, log *slog.Logger) (*group, error) {
	if shared != nil {
		// The node log opened for the other groups; this one's entries
		// have a hole, and a replica missing an entry it acknowledged
		// must not vote or serve.
		if err := shared.Damaged(); err != nil {
			return nil, fmt.Errorf("group %d: %w", id, err)
		}
	}
	dir := groupDir(dataDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "raft.db")
	_, statErr := os.Stat(path)
	fresh := errors.Is(statErr, os.ErrNotExist)
	store, err := openBolt(path)
	var hold *voteHold
	if err != nil && shared == nil && errors.Is(err, ErrBoltDamaged) {
		// The meta group: the node cannot run without its copy of the map,
		// and its peers have the whole log. The damaged file is kept for
		// diagnosis; the replica starts empty, refills from its leader and
		// does not vote meanwhile (voteHold).
		aside := fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, fmt.Errorf("group %d: open %s: %w (and moving it aside: %v)", id, path, err, rerr)
		}
		log.Error("the meta group's raft.db is damaged: moved aside, this replica refills from its leader and does not vote until it has caught up",
			"err", err, "moved_to", aside)
		hold = newVoteHold(fmt.Sprintf("raft.db was damaged (%v) and moved to %s", err, aside), false, log)
		fresh = true
		store, err = openBolt(path)
	}
	if err != nil {
		return nil, fmt.Errorf("group %d: open %s: %w", id, path, err)
	}
	stable, lost, proven, err := keepTerms(store, dir, log)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("group %d: %w", id, err)
	}
	if shared == nil {
		// The meta group: its raft.db and vote record both gone leave
		// nothing in the group's directory to prove it ever voted; the
		// data directory's mark does (metaVotedMark).
		mark := filepath.Join(dataDir, metaVotedMark)
		if _, err := os.Stat(mark); err == nil && !proven && hold == nil {
			log.Error("the meta group's raft.db and its vote record are both gone, yet this node's meta replica had voted ("+metaVotedMark+"): it refills from its leader and does not vote until the node is rebuilt",
				"raft_db", path)
			hold = newVoteHold("raft.db and its vote record are both gone, and the node's "+metaVotedMark+" mark says this replica had voted", false, log)
		}
		stable.mark = mark
		if proven {
			if err := stable.markVoted(); err != nil {
				store.Close()
				return nil, fmt.Errorf("group %d: %w", id, err)
			}
		}
	}
	if hold != nil {
		hold.proven = proven
	} else if lost && shared == nil {
		// The meta group's log lives in the same file: what lost the
		// term may have lost entries this replica acknowledged.
		hold = newVoteHold("raft.db lost the term and vote this replica had persisted (restored from its vote record) and maybe Raft log entries", true, log)
	} else if lost {
		// A shard's log is intact in the node log: it runs normally, its
		// vote answers watched.
		hold = newVoteWatch("raft.db lost the term and vote this replica had persisted (restored from its vote record)", log)
	}
	if hold != nil && proven {
		hold.provenTerm.Store(stable.rec.VoteTerm)
	}
	var logStore raft.LogStore = store
	if shared != nil {
		if err := adoptLog(store, shared, fresh, log); err != nil {
			store.Close()
			return nil, fmt.Errorf("group %d: %w", id, err)
		}
		logStore = shared
	}
	hlog := newHCLog(log, slog.LevelWarn)
	files, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hlog)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("group %d: open snapshot store: %w", id, err)
	}
	var snaps raft.SnapshotStore = files
	var marked *markerStore
	if markers != nil {
		// Streams made for followers that a crash left behind.
		if tmp, _ := filepath.Glob(filepath.Join(dir, "expanded-*.tmp")); len(tmp) > 0 {
			for _, f := range tmp {
				os.Remove(f)
			}
		}
		marked = &markerStore{FileSnapshotStore: files, dir: dir, machine: markers}
		snaps = marked
	}
	// A replica held without a proof of its term never votes: its lost
	// term is what checkVoteKept refuses for.
	if hold == nil || hold.proven {
		if err := checkVoteKept(stable, logStore, snaps); err != nil {
			store.Close()
			return nil, fmt.Errorf("group %d: %s: %w", id, path, err)
		}
	}
	existing, err := raft.HasExistingState(logStore, stable, snaps)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("group %d: %w", id, err)
	}
	// A replica that lost its store was part of the group: bootstrapping
	// it again from the flags would give it an old configuration.
	existing = existing || hold != nil
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
	logs, err := raft.NewLogCache(logCacheEntries, logStore)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("group %d: log cache: %w", id, err)
	}
	conf := t.raftConfig(localID)
	conf.Logger = hlog
	hooked := &storeHook{LogCache: logs}
	r, err := raft.NewRaft(conf, fsm, hooked, stable, snaps, serialTransport{NetworkTransport: trans, log: hlog, hold: hold})
	if err != nil {
		hold.close()
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("group %d: start raft: %w", id, err)
	}
	if hold != nil {
		hold.raft.Store(r)
	}
	if marked != nil {
		marked.started.Store(true) // NewRaft restored the latest snapshot
	}
	g := &group{id: id, dir: dir, raft: r, store: store, logs: logStore, stored: hooked, trans: trans, stream: stream, log: log, existing: existing, hold: hold,
		stopped: make(chan struct{})}
	dl := &deadLeader{r: r, tuning: t, log: log, shard: id, reloadMu: &g.reloadMu, stopped: g.stopped}
	peerClosed := dl.peerClosed
	stream.peerClosed.Store(&peerClosed)
	return g, nil
}

// openBolt opens a raft-boltdb file, refusing one cut short before bbolt
// maps it (checkBoltFile) and turning a panic of bbolt's on a damaged file
// into an error: one group's damage must not take the node down.
func openBolt(path string) (s *raftboltdb.BoltStore, err error) {
	if err := checkBoltFile(path); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("%w: %s: %v", ErrBoltDamaged, path, r)
		}
	}()
	return raftboltdb.New(raftboltdb.Options{Path: path, NoSync: noSync, BoltOptions: &bbolt.Options{Timeout: 10 * time.Second}})
}

// keepTerms wraps a group's raft.db so that its term and vote are also
// kept in the group's vote record (keptStable), and restores them from the
// record when raft.db lost them (emptied, or an older copy). lost reports
// such a restore; proven, that a record (or raft.db) proves the term.
func keepTerms(store raft.StableStore, dir string, log *slog.Logger) (_ *keptStable, lost, proven bool, _ error) {
	rec, ok, err := readVoteRecord(dir)
	if err != nil {
		log.Warn("the group's vote record is damaged: it is written again from raft.db", "err", err)
	}
	have := stableTerms(store)
	if ok {
		if lost, err = restoreTerms(store, rec); err != nil {
			return nil, lost, false, fmt.Errorf("restore the term and vote from the vote record: %w", err)
		}
		if lost {
			log.Warn("raft.db did not hold the term and vote this replica last persisted: restored them from its vote record",
				"term", rec.Term, "vote_term", rec.VoteTerm, "raft_db_term", have.Term, "raft_db_vote_term", have.VoteTerm)
		}
		have = stableTerms(store)
	}
	if !ok || lost || have.Term != rec.Term || have.VoteTerm != rec.VoteTerm || !bytes.Equal(have.Cand, rec.Cand) {
		if have.Term > 0 {
			if err := writeVoteRecord(dir, have); err != nil {
				return nil, lost, false, fmt.Errorf("write the vote record: %w", err)
			}
		}
	}
	return &keptStable{StableStore: store, dir: dir, rec: have}, lost, ok || have.Term > 0, nil
}

// errVoteLost: the stable store holds no term while the replica has state.
var errVoteLost = errors.New("no term or vote recorded, yet the replica has log entries or snapshots: its stable store was lost or damaged (a replica that forgets its vote can vote twice in a term)")

// checkVoteKept refuses a replica whose term and vote are gone while its log
// or snapshots show it took part in the group.
func checkVoteKept(stable raft.StableStore, logs raft.LogStore, snaps raft.SnapshotStore) error {
	if term, err := stable.GetUint64([]byte("CurrentTerm")); err == nil && term > 0 {
		return nil
	}
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("read log: %w", err)
	}
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	if last > 0 || len(list) > 0 {
		return fmt.Errorf("%w (last log index %d, %d snapshots)", errVoteLost, last, len(list))
	}
	return nil
}

// adoptLog readies shared to hold the group's entries. The group's
// directory decides whether the replica exists: when its raft-boltdb file
// is new (fresh), entries the node log still holds for the group belong to
// a replica deleted before a crash let the node log hear of it, and go.
// Entries in the raft-boltdb file are from before the node log (a data
// directory of an earlier version): they move into the node log (synced)
// before they leave the file, so a crash in between leaves them in one
// place or both, never neither.
func adoptLog(store *raftboltdb.BoltStore, shared *nodelog.Group, fresh bool, log *slog.Logger) error {
	if fresh {
		if first, _ := shared.FirstIndex(); first != 0 {
			log.Info("dropping Raft log entries of a replica deleted earlier", "first", first)
			if err := shared.Reset(); err != nil {
				return fmt.Errorf("drop entries of a deleted replica: %w", err)
			}
		}
		return nil
	}
	first, err := store.FirstIndex()
	if err != nil {
		return fmt.Errorf("read old log store: %w", err)
	}
	last, err := store.LastIndex()
	if err != nil {
		return fmt.Errorf("read old log store: %w", err)
	}
	if last == 0 {
		return nil
	}
	// A crash may have cut an earlier migration short: go on after what
	// the node log has.
	from := first
	if have, _ := shared.LastIndex(); have != 0 {
		from = have + 1
	}
	if from <= last {
		const chunk = 512
		for lo := from; lo <= last; lo += chunk {
			hi := min(last, lo+chunk-1)
			batch := make([]*raft.Log, 0, hi-lo+1)
			for i := lo; i <= hi; i++ {
				e := new(raft.Log)
				if err := store.GetLog(i, e); err != nil {
					return fmt.Errorf("migrate entry %d of [%d, %d] to the node log: %w", i, first, last, err)
				}
				batch = append(batch, e)
			}
			if err := shared.StoreLogs(batch); err != nil {
				return fmt.Errorf("migrate entries [%d, %d] to the node log: %w", lo, hi, err)
			}
		}
		log.Info("moved the group's Raft log into the node log", "first", from, "last", last)
	}
	if err := store.DeleteRange(first, last); err != nil {
		return fmt.Errorf("remove migrated entries from the old log store: %w", err)
	}
	return nil
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
	g.stopOnce.Do(func() { close(g.stopped) })
	err := g.raft.Shutdown().Error()
	g.hold.close()
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

// storeHook is the log store raft writes through: around each StoreLogs
// (on the leader, its loop appending entries; on a follower, replicated
// ones) it calls the functions set with hook, if any: before may change
// the entries' data (coalesce.go), after sees them stored.
type storeHook struct {
	*raft.LogCache
	fns atomic.Pointer[[2]func([]*raft.Log)]
}

// hook sets the functions called before and after every StoreLogs.
func (h *storeHook) hook(before, after func([]*raft.Log)) {
	h.fns.Store(&[2]func([]*raft.Log){before, after})
}

// StoreLog implements raft.LogStore.
func (h *storeHook) StoreLog(l *raft.Log) error { return h.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore.
func (h *storeHook) StoreLogs(logs []*raft.Log) error {
	fns := h.fns.Load()
	if fns != nil {
		fns[0](logs)
	}
	err := h.LogCache.StoreLogs(logs)
	if fns != nil {
		fns[1](logs)
	}
	return err
}
