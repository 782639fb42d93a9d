package cluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/backup"
	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/fsm"
)

// ErrDataDirNotEmpty refuses a restore into a directory that holds files.
var ErrDataDirNotEmpty = errors.New("the data directory is not empty")

// restoringMark is in a data directory while a restore prepares it; a node
// refuses to start from one.
const restoringMark = "restore.incomplete"

// RestoreConfig is what a restore needs: the flags of a first start.
type RestoreConfig struct {
	ID             string
	DataDir        string
	InitialCluster []Peer
	// Replicas per shard; 0 keeps the backup's replication factor. Either
	// way at most the number of nodes.
	Replicas int
	Logger   *slog.Logger
}

// RestoreResult says what a restore prepared.
type RestoreResult struct {
	Manifest  *backup.Manifest
	ClusterID string   // the new cluster's id
	Shards    []uint32 // the shards this node holds a replica of
}

// Restore prepares cfg.DataDir from a backup (package backup's format) so
// that the node, started afterwards with the same --id and --data-dir,
// is a member of a new cluster (a new cluster id) holding exactly the
// backup's state: the meta group starts from the backed-up map with the
// new nodes, and each shard group this node replicates starts from the
// shard's state as a Raft snapshot at the shard's backed-up index, with
// the new replicas as its configuration. Every node of --initial-cluster
// runs Restore with the same flags and file and reaches the same map. The
// number of nodes may differ from the backed-up cluster's.
//
// The directory must be empty or absent. The whole file is checked; if any
// part of it is damaged, everything written is removed and the error names
// the part.
func Restore(cfg RestoreConfig, r io.Reader) (res *RestoreResult, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.ID == "" || cfg.DataDir == "" || len(cfg.InitialCluster) == 0 {
		return nil, fmt.Errorf("%w: a restore needs --id, --data-dir and --initial-cluster", ErrInvalidRequest)
	}
	if !slices.ContainsFunc(cfg.InitialCluster, func(p Peer) bool { return p.ID == cfg.ID }) {
		return nil, fmt.Errorf("%w: node %q is not in --initial-cluster", ErrInvalidRequest, cfg.ID)
	}
	if entries, err := os.ReadDir(cfg.DataDir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%w: %s holds %d entries (a restore prepares a new node's directory only)", ErrDataDirNotEmpty, cfg.DataDir, len(entries))
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfg.DataDir, restoringMark), nil, 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			// Never a half-restored node: the directory goes back to empty.
			entries, _ := os.ReadDir(cfg.DataDir)
			for _, e := range entries {
				os.RemoveAll(filepath.Join(cfg.DataDir, e.Name()))
			}
		}
	}()

	br := backup.NewReader(r)
	p, err := br.Next()
	if err != nil {
		return nil, err
	}
	if p.Kind != backup.KindMap {
		return nil, &backup.CorruptError{Part: p.Name(), Err: errors.New("the cluster map is not the first part")}
	}
	mapData, err := io.ReadAll(io.LimitReader(p, 64<<20))
	if err != nil {
		return nil, err
	}
	var old metapb.ClusterMap
	if err := proto.Unmarshal(mapData, &old); err != nil {
		return nil, &backup.CorruptError{Part: "cluster map", Err: err}
	}
	cm := restoredMap(&old, mapData, cfg.InitialCluster, cfg.Replicas)
	res = &RestoreResult{ClusterID: cm.ClusterId}
	indexes := map[uint32]uint64{}
	for {
		p, err := br.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if p.Kind != backup.KindShard {
			return nil, &backup.CorruptError{Part: p.Name(), Err: errors.New("a part where a shard should be")}
		}
		sh := control.FindShard(cm, p.ID)
		if sh == nil {
			return nil, &backup.CorruptError{Part: p.Name(), Err: errors.New("a shard the cluster map does not have")}
		}
		pr := bufio.NewReaderSize(p, 1<<20)
		index, _, err := fsm.PeekSnapshot(pr)
		if err != nil {
			if _, derr := io.Copy(io.Discard, pr); derr != nil {
				return nil, derr // the part's own checksum says more
			}
			return nil, &backup.CorruptError{Part: p.Name(), Err: err}
		}
		indexes[p.ID] = index
		if !slices.Contains(sh.Replicas, cfg.ID) {
			if _, err := io.Copy(io.Discard, pr); err != nil {
				return nil, err
			}
			continue
		}
		if err := writeGroup(cfg.DataDir, sh.Id, index, servers(cm, sh.Replicas), pr); err != nil {
			return nil, fmt.Errorf("shard %d: %w", sh.Id, err)
		}
		res.Shards = append(res.Shards, sh.Id)
		log.Info("restore: shard prepared", "shard", sh.Id, "index", index)
	}
	m := br.Manifest()
	if m.ClusterID != old.ClusterId || len(m.Shards) != len(old.Shards) {
		return nil, &backup.CorruptError{Part: "manifest", Err: fmt.Errorf("it is of cluster %s with %d shards, the map of cluster %s with %d",
			m.ClusterID, len(m.Shards), old.ClusterId, len(old.Shards))}
	}
	for _, s := range m.Shards {
		if indexes[s.ID] != s.Index {
			return nil, &backup.CorruptError{Part: fmt.Sprintf("shard %d", s.ID),
				Err: fmt.Errorf("its state is at index %d, the manifest says %d", indexes[s.ID], s.Index)}
		}
	}
	var all []string
	for _, n := range cm.Nodes {
		all = append(all, n.Id)
	}
	data, err := proto.Marshal(cm)
	if err != nil {
		return nil, err
	}
	if err := writeGroup(cfg.DataDir, MetaGroupID, cm.Epoch, servers(cm, all), bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("the meta group: %w", err)
	}
	if err := claimDataDir(cfg.DataDir, cfg.ID); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(cfg.DataDir, restoringMark)); err != nil {
		return nil, err
	}
	res.Manifest = m
	return res, nil
}

// restoredMap is the map of the cluster a backup is restored into: the
// backed-up shards and slot table, the new nodes, each shard's replicas
// placed on them as at a bootstrap (rf consecutive nodes, rotating), and a
// new cluster id derived from the backup's map and the new nodes, so every
// node restoring the same file with the same flags computes the same map,
// and a restored node is never taken for one of the old cluster.
func restoredMap(old *metapb.ClusterMap, oldData []byte, peers []Peer, replicas int) *metapb.ClusterMap {
	rf := int(old.ReplicationFactor)
	if replicas > 0 {
		rf = replicas
	}
	rf = max(1, min(rf, len(peers)))
	h := fnv.New64a()
	fmt.Fprintf(h, "restore of %s:", old.ClusterId)
	h.Write(oldData)
	for _, p := range peers {
		fmt.Fprintf(h, "%s=%s,", p.ID, p.Address)
	}
	fmt.Fprintf(h, "/%d", rf)
	cm := &metapb.ClusterMap{
		ClusterId:         strconv.FormatUint(h.Sum64(), 16),
		ReplicationFactor: uint32(rf),
		Slots:             slices.Clone(old.Slots),
		// Past the old map's epoch, so a client that knew the old cluster
		// takes this map as newer.
		Epoch:     old.Epoch + 1,
		LastMove:  old.LastMove,
		LastShard: old.LastShard,
	}
	for _, p := range peers {
		cm.Nodes = append(cm.Nodes, withState(&metapb.Node{Id: p.ID, Address: p.Address}, NodeMember))
	}
	shards := slices.Clone(old.Shards)
	slices.SortFunc(shards, func(a, b *metapb.Shard) int { return int(a.Id) - int(b.Id) })
	for i, s := range shards {
		sh := &metapb.Shard{Id: s.Id, Retiring: s.Retiring}
		for j := 0; j < rf; j++ {
			sh.Replicas = append(sh.Replicas, peers[(i+j)%len(peers)].ID)
		}
		normalizeShard(sh)
		cm.Shards = append(cm.Shards, sh)
	}
	if len(shards) > 0 {
		cm.LastShard = max(cm.LastShard, shards[len(shards)-1].Id)
	}
	return cm
}

func servers(cm *metapb.ClusterMap, ids []string) raft.Configuration {
	var c raft.Configuration
	for _, id := range ids {
		c.Servers = append(c.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(control.FindNode(cm, id).Address)})
	}
	return c
}

// writeGroup prepares a Raft group's directory as a replica whose state
// is data at index: a snapshot at index (term 1) with the group's new
// configuration, and a stable store at term 1 with no vote. Raft restores
// the snapshot when the node starts, and the group elects a leader of a
// later term; the log is empty until then.
func writeGroup(dataDir string, id uint32, index uint64, conf raft.Configuration, data io.Reader) error {
	if index == 0 {
		index = 1 // a snapshot at index 0 is no snapshot to raft
	}
	dir := groupDir(dataDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	store, err := openBolt(filepath.Join(dir, "raft.db"))
	if err != nil {
		return err
	}
	err = store.SetUint64([]byte("CurrentTerm"), 1)
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("the group's stable store: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, newHCLog(slog.New(slog.DiscardHandler), slog.LevelWarn))
	if err != nil {
		return err
	}
	// The transport only encodes the peers for raft's legacy field, as
	// the network transport does (the address's bytes).
	_, trans := raft.NewInmemTransport("")
	defer trans.Close()
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, 1, conf, index, trans)
	if err != nil {
		return err
	}
	if _, err := io.Copy(sink, data); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}
