package fsm

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// checkpointLog is a log whose clock crosses a checkpoint bucket every
// fourth entry: entry i (from 1) carries now = i*CheckpointEvery/4.
func checkpointLog(t *testing.T, n int) []*raft.Log {
	t.Helper()
	var logs []*raft.Log
	for i := 1; i <= n; i++ {
		cmd := insertCmd(int64(i)*CheckpointEvery/4, fmt.Sprintf("t%03d", i))
		data, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, &raft.Log{Index: uint64(i), Type: raft.LogCommand, Data: data})
	}
	return logs
}

func waitCheckpoints(m *Machine) []Checkpoint {
	m.cp.wg.Wait()
	return m.Checkpoints()
}

// Two machines fed the same log, one entry by entry and one in batches of
// odd sizes, take the same checkpoints at the same indexes.
func TestCheckpointsAgreeOnTheSameLog(t *testing.T) {
	logs := checkpointLog(t, 40)
	a, b := newMachine(t, Options{}), newMachine(t, Options{})
	for _, l := range logs {
		a.Apply(l)
	}
	for i := 0; i < len(logs); i += 7 {
		b.ApplyBatch(logs[i:min(i+7, len(logs))])
	}
	ca, cb := waitCheckpoints(a), waitCheckpoints(b)
	if len(ca) != 10 {
		t.Fatalf("%d checkpoints, want 10 (one per bucket crossed): %v", len(ca), ca)
	}
	for i := range ca {
		if ca[i] != cb[i] {
			t.Fatalf("checkpoint %d differs: %+v vs %+v", i, ca[i], cb[i])
		}
		if ca[i].Index%4 != 0 {
			t.Fatalf("checkpoint at index %d, want a multiple of 4 (where the clock enters a new minute)", ca[i].Index)
		}
	}
	// The last checkpoint is the state after its entry: at the end of the
	// log here, so it equals Digest.
	if last := ca[len(ca)-1]; last.Index != 40 || last.Digest != checkpointDigest(a) {
		t.Fatalf("last checkpoint %+v, want index 40 with the machine's digest", last)
	}
}

// A machine that applied one different entry has a different digest at
// the next checkpoint, and the same ones before it.
func TestCheckpointsShowADifferentEntry(t *testing.T) {
	logs := checkpointLog(t, 24)
	a, b := newMachine(t, Options{}), newMachine(t, Options{})
	for _, l := range logs {
		a.Apply(l)
	}
	for _, l := range logs {
		if l.Index == 10 {
			// Same clock, another task: what a diverged replica applies.
			data, err := EncodeCommand(insertCmd(10*CheckpointEvery/4, "intruder"))
			if err != nil {
				t.Fatal(err)
			}
			l = &raft.Log{Index: 10, Type: raft.LogCommand, Data: data}
		}
		b.Apply(l)
	}
	ca, cb := waitCheckpoints(a), waitCheckpoints(b)
	if len(ca) != len(cb) || len(ca) != 6 {
		t.Fatalf("checkpoints %d and %d, want 6 each", len(ca), len(cb))
	}
	for i := range ca {
		if ca[i].Index != cb[i].Index {
			t.Fatalf("checkpoint %d at %d and %d: indexes depend only on time", i, ca[i].Index, cb[i].Index)
		}
		if same := ca[i].Digest == cb[i].Digest; same != (ca[i].Index < 10) {
			t.Fatalf("checkpoint at %d: digests equal = %v, want %v", ca[i].Index, same, ca[i].Index < 10)
		}
	}
}

// A checkpoint inside a batch is of the state right after its entry, not
// after the batch.
func TestCheckpointMidBatch(t *testing.T) {
	m, ref := newMachine(t, Options{}), newMachine(t, Options{})
	cmds := []*fsmpb.Command{
		insertCmd(CheckpointEvery+1, "a"),
		insertCmd(CheckpointEvery+2, "b"),
		insertCmd(2*CheckpointEvery+5, "c"), // enters a new bucket: checkpoint at 3
		insertCmd(2*CheckpointEvery+6, "d"),
		{Op: fsmpb.Op_OP_TICK, Now: 2*CheckpointEvery + 7},
	}
	var logs []*raft.Log
	for i, cmd := range cmds {
		data, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, &raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: data})
	}
	// A configuration entry does not move the clock.
	logs = append(logs, &raft.Log{Index: 6, Type: raft.LogConfiguration})
	m.ApplyBatch(logs)
	for _, l := range logs[:3] {
		ref.Apply(l)
	}
	got := waitCheckpoints(m)
	// Index 1 enters the first bucket from clock 0; index 3 the next.
	if len(got) != 2 || got[0].Index != 1 || got[1].Index != 3 {
		t.Fatalf("checkpoints %+v, want at 1 and 3", got)
	}
	if got[1].Digest != checkpointDigest(ref) || got[1].Clock != 2*CheckpointEvery+5 {
		t.Fatalf("checkpoint at 3 is not the state after entry 3")
	}
	if got[1].Digest == checkpointDigest(m) {
		t.Fatal("checkpoint at 3 equals the state after the batch")
	}
}

// The ring keeps the newest 16; Restore forgets them (the state they
// describe was replaced).
func TestCheckpointRingAndRestore(t *testing.T) {
	m, later := newMachine(t, Options{}), newMachine(t, Options{})
	for i := 1; i <= 50; i++ {
		cmd := &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: int64(i) * CheckpointEvery}
		if i <= 40 {
			m.ApplyCommand(uint64(i), cmd)
		}
		later.ApplyCommand(uint64(i), cmd)
	}
	got := waitCheckpoints(m)
	if len(got) != checkpointRing || got[0].Index != 25 || got[len(got)-1].Index != 40 {
		t.Fatalf("ring holds %d from %d to %d, want 16 from 25 to 40", len(got), got[0].Index, got[len(got)-1].Index)
	}
	// A snapshot past the machine's index (one at or before it, a machine
	// on disk keeps its state for: TestOnDiskRestoreKeepsALaterState).
	if err := m.Restore(io.NopCloser(bytes.NewReader(persist(t, later)))); err != nil {
		t.Fatal(err)
	}
	if got := waitCheckpoints(m); len(got) != 0 {
		t.Fatalf("%d checkpoints after Restore, want none", len(got))
	}
}

// checkpointDigest is what a checkpoint of m's state now would hold.
func checkpointDigest(m *Machine) [32]byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if d, ok := m.st.store.(*diskStore); ok {
		return onDiskDigest(d, m.st.clock)
	}
	return digestOf(m.st.snapshot())
}
