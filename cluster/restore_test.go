package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

// A 5-node map restored into 3 nodes: every shard keeps its id, the slot
// table is the same, replicas are placed over the new nodes only, and the
// cluster id is new and the same on every node.
func TestRestoredMapIntoFewerNodes(t *testing.T) {
	five := []Peer{{"a", "h1:1"}, {"b", "h2:1"}, {"c", "h3:1"}, {"d", "h4:1"}, {"e", "h5:1"}}
	old := InitialMap(ClusterID(five, 5, 3), five, 5, 3)
	old.Epoch = 40
	old.Shards[4].InitialReplicas = []string{"a", "b", "c"}
	data, err := proto.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	three := []Peer{{"n1", "x:1"}, {"n2", "x:2"}, {"n3", "x:3"}}
	cm := restoredMap(old, data, three, 0)
	again := restoredMap(old, data, three, 0)
	if !proto.Equal(cm, again) {
		t.Fatal("two nodes restoring the same backup compute different maps")
	}
	if cm.ClusterId == old.ClusterId || cm.ClusterId == "" {
		t.Fatalf("cluster id %q (old %q)", cm.ClusterId, old.ClusterId)
	}
	if !slices.Equal(cm.Slots, old.Slots) || len(cm.Shards) != 5 || cm.Epoch != 41 || cm.ReplicationFactor != 3 {
		t.Fatalf("restored map: %v", cm)
	}
	for _, sh := range cm.Shards {
		if len(sh.Replicas) != 3 || sh.PreferredLeader != sh.Replicas[0] || len(sh.InitialReplicas) != 0 {
			t.Errorf("shard %d: replicas %v, preferred %q, initial %v", sh.Id, sh.Replicas, sh.PreferredLeader, sh.InitialReplicas)
		}
		for _, r := range sh.Replicas {
			if !strings.HasPrefix(r, "n") {
				t.Errorf("shard %d placed on %q, not a new node", sh.Id, r)
			}
		}
	}
	if one := restoredMap(old, data, three[:1], 0); one.ReplicationFactor != 1 {
		t.Errorf("restored into one node with replication factor %d", one.ReplicationFactor)
	}
}

// A node does not start from a directory a restore did not finish, and a
// restore refuses a directory that holds anything.
func TestRestoreLeftovers(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, restoringMark), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(Config{ID: "n1", DataDir: dir, ListenAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "restore") {
		t.Fatalf("start from a half-restored directory: %v", err)
	}
	_, err = Restore(RestoreConfig{ID: "n1", DataDir: dir, InitialCluster: []Peer{{"n1", "127.0.0.1:1"}}}, strings.NewReader(""))
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("restore into a non-empty directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, restoringMark)); err != nil {
		t.Fatalf("the refused restore touched the directory: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "new")
	_, err = Restore(RestoreConfig{ID: "n1", DataDir: empty, InitialCluster: []Peer{{"n1", "127.0.0.1:1"}}}, strings.NewReader("TSBACKUP\x00\x00\x00\x01P"))
	if err == nil || !strings.Contains(err.Error(), "damaged or truncated") {
		t.Fatalf("restore of a truncated file: %v", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Fatalf("a failed restore left %d entries", len(entries))
	}
}
