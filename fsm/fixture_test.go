package fsm

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// snapshotFixture is a snapshot written by the in-memory state machine of
// November 2026 (the format snapshot.go describes), kept so that every later
// version proves it still loads what nodes have on disk: the state on disk
// and tasks keyed by group and id both change the
// state, and both must migrate this. Rewrite it only on purpose (go test
// -run TestSnapshotFixture -update), never to make a failing load pass.
const snapshotFixture = "testdata/snapshot-2026-11.bin"

// fixtureLog builds the fixture's state: several groups and queues,
// priorities, delays, keys, a claim with a lease, a moved task with attempt
// and err, deletes, and exactly-once sessions (one of them a claim's).
func fixtureLog() []*fsmpb.Command {
	var log []*fsmpb.Command
	ins := func(now int64, group string, inserts ...*fsmpb.Insert) {
		log = append(log, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, ClientId: "producer-" + group, Seq: uint64(len(log) + 1),
			Modify: &fsmpb.Modify{Group: group, Inserts: inserts}})
	}
	for i := range 20 {
		g := fmt.Sprintf("g%d", i%3)
		ins(int64(1000+i), g,
			&fsmpb.Insert{Id: fmt.Sprintf("%s-t%d", g, i), Queue: g + "/work", Priority: int32(i % 4), Value: []byte(fmt.Sprintf("value %d", i))},
			&fsmpb.Insert{Id: fmt.Sprintf("%s-d%d", g, i), Queue: g + "/later", At: int64(5000 + i), Key: fmt.Sprintf("k%d", i)})
	}
	log = append(log, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 2000, ClientId: "worker-1", Seq: 7,
		Claim: &fsmpb.Claim{Claimant: "worker-1", Queues: []string{"g0/work"}, Lease: 3000, Limit: 2}})
	log = append(log, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 2100, Modify: &fsmpb.Modify{Group: "g1",
		Changes: []*fsmpb.Change{{Id: "g1-t1", Version: 1, Queue: "g1/dead", Attempt: ptr(uint32(3)), Err: ptr("gave up")}},
		Deletes: []*fsmpb.Ref{{Id: "g1-t4", Version: 1}}}})
	log = append(log, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 2200, Modify: &fsmpb.Modify{Group: "g2",
		Deletes: []*fsmpb.Ref{{Id: "g2-d2", Version: 1}}}})
	return log
}

func ptr[T any](v T) *T { return &v }

func fixtureMachine(t *testing.T) *Machine {
	m := newMachine(t, Options{})
	for i, cmd := range fixtureLog() {
		if res := m.ApplyCommand(uint64(i+1), cmd); res.Failure != nil {
			t.Fatalf("fixture command %d: %v", i, res.Failure)
		}
	}
	return m
}

// TestSnapshotFixture restores the committed snapshot of today's format and
// checks that it holds exactly the state its log builds: the same digest
// (tasks, clock, sessions), the same answers to reads, and a retried request
// answered from its stored session. It loads into the on-disk store too:
// that is how a data directory of today's snapshots migrates.
func TestSnapshotFixture(t *testing.T) {
	t.Run("memory", func(t *testing.T) { snapshotFixture2026(t, memMachine) })
	if !*update {
		t.Run("ondisk", func(t *testing.T) { snapshotFixture2026(t, diskMachine) })
	}
}

func snapshotFixture2026(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	want := fixtureMachine(t)
	if *update {
		if err := os.WriteFile(snapshotFixture, persist(t, want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.FromSlash(snapshotFixture))
	if err != nil {
		t.Fatalf("%v (write it with -update)", err)
	}
	got := newMachine(t, Options{})
	if err := got.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatalf("the snapshot of 2026-11 does not load: %v", err)
	}
	if got.Digest() != want.Digest() {
		t.Errorf("restored digest %x, want %x (the state its log builds)", got.Digest(), want.Digest())
	}
	if g, w := got.TaskCount(), want.TaskCount(); g != w || g != 38 {
		t.Errorf("restored %d tasks, the log builds %d; want 38", g, w)
	}
	for _, id := range []string{"g0-t0", "g0-t3", "g1-t1", "g2-d5"} {
		g, w := got.Get([]string{id}), want.Get([]string{id})
		if len(g) != 1 || len(w) != 1 || g[0].String() != w[0].String() {
			t.Errorf("task %s: restored %v, want %v", id, g, w)
		}
	}
	if g := got.Get([]string{"g1-t1"}); len(g) != 1 || g[0].Queue != "g1/dead" || g[0].Attempt != 3 || g[0].Err != "gave up" {
		t.Errorf("the moved task: %v", g)
	}
	// The claim took the two of priority 3, g0-t3 and g0-t15.
	for _, id := range []string{"g0-t3", "g0-t15"} {
		if g := got.Get([]string{id}); len(g) != 1 || g[0].Claimant != "worker-1" || g[0].Claims != 1 || g[0].At != 5000 {
			t.Errorf("claimed task %s: %v", id, g)
		}
	}
	if g, w := fmt.Sprint(got.Queues("", 0)), fmt.Sprint(want.Queues("", 0)); g != w {
		t.Errorf("queues: restored %s, want %s", g, w)
	}
	// The claim's session answers its retry with the stored tasks.
	retry := fixtureLog()[20]
	res := got.ApplyCommand(100, retry)
	if !res.Replayed || len(res.GetClaim().GetTasks()) != 2 {
		t.Errorf("the retried claim: %v, want its stored answer of 2 tasks", res)
	}
}
