package cluster

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/backup"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// bufSink is a raft.SnapshotSink into memory.
type bufSink struct{ bytes.Buffer }

func (*bufSink) ID() string    { return "bench" }
func (*bufSink) Close() error  { return nil }
func (*bufSink) Cancel() error { return nil }

// benchBackupFile is a backup of 3 shards holding tasks tasks of 64 bytes
// in all, every shard's part the same state stream (each shard holds a
// third of them).
func benchBackupFile(b *testing.B, tasks int) []byte {
	m := fsm.New(fsm.Options{})
	value := make([]byte, 64)
	for i := 0; i < tasks/3; i += 1000 {
		mod := &fsmpb.Modify{Group: fmt.Sprintf("g%d", i/1000%30)}
		for j := range min(1000, tasks/3-i) {
			mod.Inserts = append(mod.Inserts, &fsmpb.Insert{Id: fmt.Sprintf("t%08d", i+j), Queue: mod.Group + "/q", Value: value})
		}
		m.ApplyCommand(uint64(1+i/1000), &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: mod})
	}
	snap, err := m.FullSnapshot()
	if err != nil {
		b.Fatal(err)
	}
	var state bufSink
	if err := snap.Persist(&state); err != nil {
		b.Fatal(err)
	}
	index, _, _ := fsm.SnapshotInfo(snap)
	snap.Release()
	peers := []Peer{{"a", "h1:1"}, {"b", "h2:1"}, {"c", "h3:1"}}
	cm := InitialMap(ClusterID(peers, 3, 3), peers, 3, 3)
	cm.Epoch = 5
	mapData, err := proto.Marshal(cm)
	if err != nil {
		b.Fatal(err)
	}
	var file bytes.Buffer
	w, err := backup.NewWriter(&file)
	if err != nil {
		b.Fatal(err)
	}
	write := func(k backup.Kind, id uint32, data []byte) {
		pw, err := w.Part(k, id)
		if err == nil {
			_, err = pw.Write(data)
		}
		if err == nil {
			_, err = pw.Close()
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	write(backup.KindMap, 0, mapData)
	man := &backup.Manifest{ClusterID: cm.ClusterId, MapEpoch: cm.Epoch, ReplicationFactor: 3, Slots: len(cm.Slots)}
	for _, sh := range cm.Shards {
		write(backup.KindShard, sh.Id, state.Bytes())
		man.Shards = append(man.Shards, backup.ShardInfo{ID: sh.Id, Index: index, Tasks: uint64(tasks / 3)})
	}
	if err := w.Finish(man); err != nil {
		b.Fatal(err)
	}
	return file.Bytes()
}

// BenchmarkRestoreFile is one node's `taskstored restore` of a backup of
// a million tasks of 64 bytes in 3 shards, the node a replica of each:
// the file read and checked, and each shard's state written as its
// group's Raft snapshot.
//
//	go test -run '^$' -bench RestoreFile -benchtime 3x ./cluster/
func BenchmarkRestoreFile(b *testing.B) {
	file := benchBackupFile(b, 1_000_000)
	peers := []Peer{{"n1", "127.0.0.1:1"}, {"n2", "127.0.0.1:2"}, {"n3", "127.0.0.1:3"}}
	b.SetBytes(int64(len(file)))
	b.ResetTimer()
	var took time.Duration
	for i := range b.N {
		dir := filepath.Join(b.TempDir(), fmt.Sprint(i))
		start := time.Now()
		if _, err := Restore(RestoreConfig{ID: "n1", DataDir: dir, InitialCluster: peers}, bytes.NewReader(file)); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		b.StopTimer()
		os.RemoveAll(dir)
		b.StartTimer()
	}
	b.ReportMetric(float64(len(file))*float64(b.N)/1e6/took.Seconds(), "MB/s")
}
