package fsm

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// budgetInsert is a Modify inserting n 64-byte tasks into g/q, ids from
// first, stamped with budget.
func budgetInsert(now int64, first, n int, b *fsmpb.MemoryBudget) *fsmpb.Command {
	m := &fsmpb.Modify{Group: "g"}
	for i := range n {
		m.Inserts = append(m.Inserts, &fsmpb.Insert{Id: fmt.Sprintf("t%06d", first+i), Queue: "g/q", Value: bytes.Repeat([]byte{'v'}, 64)})
	}
	return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: m, Budget: b}
}

// TestMemoryBudget: once a shard's tasks reach the stamped budget, a
// Modify that would grow them is refused with MemoryFull, and nothing of
// it applies; claims, commits (deletes) and purges still apply and make
// room, after which the same request (same client and sequence: the
// refusal is not remembered) applies.
func TestMemoryBudget(t *testing.T) {
	m := newMachine(t, Options{})
	m.ApplyCommand(1, SetFormatCommand(FormatMemoryBudget))
	// 10 tasks of 7+64 counted bytes and 100 overhead: 1710 bytes.
	b := &fsmpb.MemoryBudget{Bytes: 1710, TaskOverhead: 100}
	idx := uint64(2)
	apply := func(cmd *fsmpb.Command) *fsmpb.Result {
		idx++
		return m.ApplyCommand(idx, cmd)
	}
	if res := apply(budgetInsert(10, 0, 10, b)); res.Failure != nil {
		t.Fatalf("10 tasks within the budget: %v", res.Failure)
	}
	if got := m.MemoryUse(100); got != 1710 {
		t.Fatalf("MemoryUse = %d, want 1710", got)
	}
	over := budgetInsert(11, 10, 1, b)
	over.ClientId, over.Seq = "producer", 1
	res := apply(over)
	if !strings.HasPrefix(res.GetFailure().GetMessage(), MemoryFull) {
		t.Fatalf("an insert past the budget: %v, want %q", res, MemoryFull)
	}
	for _, want := range []string{"1.7 KiB", "claim", "purge", "--state disk"} {
		if !strings.Contains(res.Failure.Message, want) {
			t.Errorf("refusal %q does not say %q", res.Failure.Message, want)
		}
	}
	if m.TaskCount() != 10 {
		t.Fatalf("%d tasks after the refusal, want 10", m.TaskCount())
	}
	// Below the budget's format, or without a stamp, nothing is refused:
	// what an older binary's replicas do.
	claim := apply(&fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 12, Budget: b,
		Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 1000, Limit: 2}})
	if n := len(claim.GetClaim().GetTasks()); n != 2 {
		t.Fatalf("a claim at the budget took %d tasks, want 2: %v", n, claim)
	}
	tk := claim.Claim.Tasks[0]
	del := apply(&fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 13, Budget: b,
		Modify: &fsmpb.Modify{Group: "g", Claimant: "w", Deletes: []*fsmpb.Ref{{Id: tk.Id, Version: tk.Version}}}})
	if del.Failure != nil {
		t.Fatalf("a commit at the budget: %v", del.Failure)
	}
	// A commit that inserts the next task in place of the one it deletes
	// does not grow the state.
	tk = claim.Claim.Tasks[1]
	next := budgetInsert(14, 100, 1, b)
	next.Modify.Claimant = "w"
	next.Modify.Deletes = []*fsmpb.Ref{{Id: tk.Id, Version: tk.Version}}
	if res := apply(next); res.Failure != nil {
		t.Fatalf("delete one, insert one at the budget: %v", res.Failure)
	}
	over.Now = 15
	if res := apply(over); res.Failure != nil || res.Replayed {
		t.Fatalf("the refused request again after a commit made room: %v", res)
	}
	if res := apply(over); !res.Replayed {
		t.Fatalf("the applied request again: %v, want its answer replayed", res)
	}
	if res := apply(budgetInsert(16, 200, 1, b)); !strings.HasPrefix(res.GetFailure().GetMessage(), MemoryFull) {
		t.Fatalf("full again: %v", res)
	}
	if res := apply(&fsmpb.Command{Op: fsmpb.Op_OP_PURGE, Now: 17, Budget: b, Purge: &fsmpb.Purge{Queue: "g/q"}}); res.GetPurge().GetDeleted() != 10 {
		t.Fatalf("purge at the budget: %v", res)
	}
	if got := m.MemoryUse(100); got != 0 {
		t.Fatalf("MemoryUse after the purge = %d, want 0", got)
	}
	if res := apply(budgetInsert(18, 200, 10, b)); res.Failure != nil {
		t.Fatalf("after the purge: %v", res.Failure)
	}
}

// TestMemoryBudgetNeedsItsFormat: below FormatMemoryBudget the stamp is
// ignored, as a replica of a binary that does not know it ignores it.
func TestMemoryBudgetNeedsItsFormat(t *testing.T) {
	m := newMachine(t, Options{})
	m.ApplyCommand(1, SetFormatCommand(FormatSlotMoves))
	if res := m.ApplyCommand(2, budgetInsert(10, 0, 5, &fsmpb.MemoryBudget{Bytes: 1, TaskOverhead: 100})); res.Failure != nil {
		t.Fatalf("below the format: %v", res.Failure)
	}
}

// TestMemoryBudgetCountsAlike: the count the refusal reads is the same on
// both stores, after the same log, after a reopen of the on-disk store
// (its small record), after a restore from either store's snapshot, and
// after a format raise recounts a store an older binary wrote.
func TestMemoryBudgetCountsAlike(t *testing.T) {
	log := genLog(t, 35, 600)
	mem := New(diskTestOptions)
	fs := vfs.NewMem()
	db, disk := openOnDisk(t, fs)
	for _, m := range []*Machine{mem, disk} {
		m.ApplyBatch(log)
		m.ApplyCommand(uint64(len(log)+1), SetFormatCommand(FormatMemoryBudget))
	}
	want := mem.MemoryUse(0)
	if want == 0 || mem.TaskCount() == 0 {
		t.Fatalf("the log left %d tasks taking %d bytes: nothing to compare", mem.TaskCount(), want)
	}
	if got := recount(mem); got != want {
		t.Fatalf("memory: kept %d bytes, the tasks take %d", want, got)
	}
	if got := disk.MemoryUse(0); got != want {
		t.Fatalf("disk: %d bytes, memory %d", got, want)
	}
	fromDisk := New(diskTestOptions)
	if err := fromDisk.Restore(io.NopCloser(bytes.NewReader(persisted(t, disk)))); err != nil {
		t.Fatal(err)
	}
	if got := fromDisk.MemoryUse(0); got != want {
		t.Fatalf("restored from the disk's snapshot: %d bytes, want %d", got, want)
	}
	disk.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, disk = openOnDisk(t, fs)
	defer db.Close()
	if got := disk.MemoryUse(0); got != want {
		t.Fatalf("disk reopened: %d bytes, want %d", got, want)
	}
	disk2 := diskMachine(t, diskTestOptions)
	if err := disk2.Restore(io.NopCloser(bytes.NewReader(persisted(t, mem)))); err != nil {
		t.Fatal(err)
	}
	if got := disk2.MemoryUse(0); got != want {
		t.Fatalf("disk restored from memory's snapshot: %d bytes, want %d", got, want)
	}

	// A store whose count is off (written by a binary that kept none) is
	// recounted when the format is raised.
	stale := New(diskTestOptions)
	stale.ApplyBatch(log)
	stale.st.taskBytes, stale.st.format = -5, FormatSlotMoves
	stale.ApplyCommand(uint64(len(log)+1), SetFormatCommand(FormatMemoryBudget))
	if got := stale.MemoryUse(0); got != want {
		t.Fatalf("recounted at the format raise: %d bytes, want %d", got, want)
	}
}

// recount is what m's tasks take, counted from them.
func recount(m *Machine) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := m.st.taskBytes
	m.st.recountTaskBytes()
	n := m.st.taskBytes
	m.st.taskBytes = kept
	return uint64(n)
}
