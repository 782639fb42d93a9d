package fsm

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

const testSlots = taskstorepb.DefaultSlots

// The slot of a group is part of the routing contract: fsm's copy of the
// hash must agree with the API's.
func TestSlotOfMatchesRoutingContract(t *testing.T) {
	for i := range 5000 {
		g := fmt.Sprintf("group-%d", i)
		if got, want := SlotOf(g, testSlots), taskstorepb.SlotOf(g, testSlots); int(got) != want {
			t.Fatalf("SlotOf(%q) = %d, routing says %d", g, got, want)
		}
	}
	if got, want := SlotOf("", 7), taskstorepb.SlotOf("", 7); int(got) != want {
		t.Fatalf("SlotOf(\"\", 7) = %d, routing says %d", got, want)
	}
}

// groupsIn returns n group names in slot, and one that is not.
func groupsIn(slot uint32, n int) (in []string, out string) {
	for i := 0; len(in) < n || out == ""; i++ {
		g := fmt.Sprintf("g%d", i)
		if SlotOf(g, testSlots) == slot {
			if len(in) < n {
				in = append(in, g)
			}
		} else if out == "" {
			out = g
		}
	}
	return in, out
}

// slotRig is two machines at FormatSlotMoves, the source and the target of
// a move, each with its own log index.
type slotRig struct {
	t        *testing.T
	src, dst *Machine
	si, di   uint64
	now      int64
	notified []string
}

func newSlotRig(t *testing.T, newMachine func(testing.TB, Options) *Machine) *slotRig {
	r := &slotRig{t: t, now: 1000}
	r.src = newMachine(t, Options{OnAvailable: func(q []string) { r.notified = append(r.notified, q...) }})
	r.dst = newMachine(t, Options{})
	r.on(r.src, SetFormatCommand(FormatSlotMoves))
	r.on(r.dst, SetFormatCommand(FormatSlotMoves))
	return r
}

func (r *slotRig) on(m *Machine, cmd *fsmpb.Command) *fsmpb.Result {
	r.now += 10
	if cmd.Now == 0 {
		cmd.Now = r.now
	}
	idx := &r.si
	if m == r.dst {
		idx = &r.di
	}
	*idx++
	return m.ApplyCommand(*idx, cmd)
}

func (r *slotRig) ok(m *Machine, cmd *fsmpb.Command) *fsmpb.Result {
	r.t.Helper()
	res := r.on(m, cmd)
	if res.Failure != nil {
		r.t.Fatalf("%v: %v", cmd.Op, res.Failure)
	}
	return res
}

func slotCmd(a fsmpb.SlotCommand_Action, slot uint32, move uint64) *fsmpb.SlotCommand {
	return &fsmpb.SlotCommand{Action: a, Slot: slot, Slots: testSlots, Move: move}
}

func slotOp(c *fsmpb.SlotCommand) *fsmpb.Command {
	return &fsmpb.Command{Op: fsmpb.Op_OP_SLOT, Slot: c}
}

func modifyOf(group string, ins ...*fsmpb.Insert) *fsmpb.Command {
	return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: group, Inserts: ins}}
}

// slotTasks lists every task of the machine whose group is in slot, by
// queue then id, without the fields a move may legitimately not keep.
func slotTasks(m *Machine, slot uint32) []string {
	var out []string
	for _, q := range m.Queues("", 0) {
		if SlotOf(GroupOf(q.Name), testSlots) != slot {
			continue
		}
		tasks, _, err := m.List(q.Name, "", 100000, nil, false)
		if err != nil {
			panic(err)
		}
		for _, t := range tasks {
			out = append(out, fmt.Sprintf("%s %s v%d at=%d claimant=%q key=%q prio=%d value=%q attempt=%d claims=%d dedup=%d",
				t.Queue, t.Id, t.Version, t.At, t.Claimant, t.Key, t.Priority, t.Value, t.Attempt, t.Claims, t.DedupWindow))
		}
	}
	slices.Sort(out)
	return out
}

// move copies the frozen slot from src to dst in chunks of about maxBytes.
func (r *slotRig) move(slot uint32, move uint64, maxBytes int) (chunks int) {
	r.t.Helper()
	var cur SlotCursor
	for chunk := uint32(0); ; chunk++ {
		ch, err := r.src.ExportSlot(slot, testSlots, move, cur, maxBytes)
		if err != nil {
			r.t.Fatal(err)
		}
		c := slotCmd(fsmpb.SlotCommand_IMPORT, slot, move)
		c.Chunk, c.Records = chunk, ch.Records
		r.ok(r.dst, slotOp(c))
		if chunk == 1 {
			r.ok(r.dst, slotOp(c)) // a repeated step (its outcome was unknown) is applied as nothing
		}
		chunks++
		if ch.Done {
			return chunks
		}
		if ch.Next == cur {
			r.t.Fatalf("export did not advance past %+v", cur)
		}
		cur = ch.Next
	}
}

// A slot moves with everything of its groups: tasks (available, claimed,
// delayed, keyed, with dedup windows), pauses, limits, key reservations,
// schedules and the exactly-once sessions; the source refuses the slot from
// the freeze on, the target until it is activated, and the rest of the
// source's slots are untouched.
func TestSlotMoveCarriesTheSlotsState(t *testing.T) { onEachStore(t, slotMoveCarriesTheSlotsState) }

func slotMoveCarriesTheSlotsState(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	r := newSlotRig(t, newMachine)
	const slot, move = 7, 42
	groups, other := groupsIn(slot, 3)
	for i, g := range groups {
		var ins []*fsmpb.Insert
		for j := range 40 {
			in := &fsmpb.Insert{Id: fmt.Sprintf("t%d", j), Queue: g + "/work", Value: bytes.Repeat([]byte{byte('a' + j%26)}, 10+j), Priority: int32(j % 3)}
			switch j % 5 {
			case 1:
				in.Key = fmt.Sprintf("k%d", j)
			case 2:
				in.At = r.now + 1_000_000 // delayed
			case 3:
				in.Key, in.DedupWindow = fmt.Sprintf("d%d", j), 1_000_000_000
			}
			ins = append(ins, in)
		}
		r.ok(r.src, modifyOf(g, ins...))
		// The same ids in another group, and in a group of another slot.
		r.ok(r.src, modifyOf(other, &fsmpb.Insert{Id: fmt.Sprintf("t%d", i), Queue: other + "/work"}))
	}
	g := groups[0]
	// A claim (a lease that moves with the task), a pause, a limit, a
	// schedule and a key reserved by a deleted task, all in the slot.
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Claim: &fsmpb.Claim{Claimant: "w1", Queues: []string{g + "/work"}, Lease: 1_000_000, Limit: 2}})
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_PAUSE, Pause: &fsmpb.Pause{Queue: groups[1] + "/work", Paused: true}})
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_LIMIT, Limit: &fsmpb.QueueLimit{Queue: groups[2] + "/work", MaxClaimed: 3}})
	r.on(r.src, SetFormatCommand(FormatRate))
	r.on(r.dst, SetFormatCommand(FormatRate))
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_POLICY, Policy: &fsmpb.QueuePolicy{Queue: groups[2] + "/work", MaxClaims: 2, DeadLetter: groups[2] + "/dead",
		RateInterval: 1_000_000, Burst: 2}})
	// Two tokens of the rate spent: the bucket's state moves with the policy.
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Claim: &fsmpb.Claim{Claimant: "w2", Queues: []string{groups[2] + "/work"}, Lease: 1_000_000, Limit: 2}})
	bucket := r.src.Queues(groups[2]+"/work", 1)[0].Policy.GetBucketFullAt()
	if bucket == 0 {
		t.Fatal("a claim under a rate left the bucket full")
	}
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: &fsmpb.Schedule{Queue: g + "/cron", Name: "nightly", Next: r.now + 5000, Every: 5000}})
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: g, Deletes: []*fsmpb.Ref{{Id: "t3", Version: 1}}}})
	// The last request of a client, in the slot: its retry must be answered
	// by the target as the source answered it.
	insert := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, ClientId: "c1", Seq: 5,
		Modify: &fsmpb.Modify{Group: g, Inserts: []*fsmpb.Insert{{Id: "once", Queue: g + "/work"}}}}
	first := r.ok(r.src, insert)
	// A client whose last request was in another slot stays behind.
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, ClientId: "c2", Seq: 1, Modify: &fsmpb.Modify{Group: other, Inserts: []*fsmpb.Insert{{Id: "x", Queue: other + "/work"}}}})

	want := slotTasks(r.src, slot)
	otherBefore := slotTasks(r.src, SlotOf(other, testSlots))

	r.notified = nil
	freeze := slotCmd(fsmpb.SlotCommand_FREEZE, slot, move)
	freeze.To = 2
	r.ok(r.src, slotOp(freeze))
	if !slices.Contains(r.notified, g+"/work") {
		t.Fatalf("the freeze did not wake waiting claims of %s/work (notified %v)", g, r.notified)
	}
	// Frozen: the slot's commands are refused with where it goes, and not
	// remembered; other slots go on.
	retry := proto.Clone(insert).(*fsmpb.Command)
	retry.Seq = 6
	res := r.on(r.src, retry)
	if mv := res.GetFailure().GetMoved(); mv == nil || mv.To != 2 || !strings.HasPrefix(res.Failure.Message, SlotMoved) {
		t.Fatalf("a write to the frozen slot: %v, want a moved refusal naming shard 2", res)
	}
	for _, cmd := range []*fsmpb.Command{
		{Op: fsmpb.Op_OP_CLAIM, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{g + "/work"}, Lease: 10, Limit: 1}},
		{Op: fsmpb.Op_OP_PURGE, Purge: &fsmpb.Purge{Queue: g + "/work"}},
		{Op: fsmpb.Op_OP_PAUSE, Pause: &fsmpb.Pause{Queue: g + "/work", Paused: true}},
		{Op: fsmpb.Op_OP_FIRE, Fire: &fsmpb.Fire{Queue: g + "/cron", Name: "nightly", Tick: 1, Next: 2}},
	} {
		if res := r.on(r.src, cmd); res.GetFailure().GetMoved() == nil {
			t.Fatalf("%v on the frozen slot: %v, want a moved refusal", cmd.Op, res)
		}
	}
	r.ok(r.src, modifyOf(other, &fsmpb.Insert{Id: "during", Queue: other + "/work"}))
	if got := slotTasks(r.src, slot); !slices.Equal(got, want) {
		t.Fatal("refused commands changed the frozen slot")
	}

	if n := r.move(slot, move, 300); n < 10 {
		t.Fatalf("the copy took %d chunks of 300 bytes; the test wants many", n)
	}
	// Importing: the target refuses the slot until activated.
	if res := r.on(r.dst, proto.Clone(retry).(*fsmpb.Command)); res.GetFailure().GetMoved() == nil {
		t.Fatalf("the importing target applied a write: %v", res)
	}
	// Reads of the importing slot are another shard's: nothing listed.
	if got := slotTasks(r.dst, slot); len(got) != 0 || r.dst.ReadsGroup(g) {
		t.Fatalf("the importing target lists %d tasks of the slot (reads it: %v)", len(got), r.dst.ReadsGroup(g))
	}
	if !r.src.ReadsGroup(g) {
		t.Fatal("the frozen source does not answer reads of its slot")
	}
	r.ok(r.dst, slotOp(slotCmd(fsmpb.SlotCommand_ACTIVATE, slot, move)))
	if got := slotTasks(r.dst, slot); !slices.Equal(got, want) {
		t.Fatalf("the target holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	r.ok(r.dst, slotOp(slotCmd(fsmpb.SlotCommand_ACTIVATE, slot, move))) // again: no change

	// The client's retry is answered from the moved session.
	again := r.on(r.dst, proto.Clone(insert).(*fsmpb.Command))
	if !again.Replayed || again.GetModify().GetInserted()[0].GetId() != first.GetModify().GetInserted()[0].GetId() {
		t.Fatalf("retry at the target: %v, want the replay of %v", again, first)
	}
	// The request the source refused applies at the target, once.
	if res := r.on(r.dst, proto.Clone(retry).(*fsmpb.Command)); res.Failure == nil {
		t.Fatalf("the write the source refused was refused at the target: %v", res)
	}
	if res := r.on(r.dst, proto.Clone(retry).(*fsmpb.Command)); !res.Replayed {
		t.Fatalf("its retry at the target: %v, want a replay", res)
	}
	// The client of the other slot did not move.
	if res := r.on(r.dst, &fsmpb.Command{Op: fsmpb.Op_OP_TICK, ClientId: "c2", Seq: 1}); res.Replayed {
		t.Fatal("a session of another slot moved")
	}
	// Settings moved: the pause, the limit, the schedule, the reservation.
	if qs := r.dst.Queues(groups[1]+"/work", 1); len(qs) != 1 || !qs[0].Paused {
		t.Fatalf("pause did not move: %+v", qs)
	}
	if qs := r.dst.Queues(groups[2]+"/work", 1); len(qs) != 1 || qs[0].MaxClaimed != 3 || qs[0].Policy.GetMaxClaims() != 2 {
		t.Fatalf("limit or policy did not move: %+v", qs)
	}
	if qs := r.dst.Queues(groups[2]+"/work", 1); qs[0].Policy.GetRateInterval() != 1_000_000 || qs[0].Policy.GetBucketFullAt() != bucket {
		t.Fatalf("the rate or its bucket did not move: %v, want bucket full at %d", qs[0].Policy, bucket)
	}
	if sc := r.dst.Schedules(g); len(sc) != 1 || sc[0].Name != "nightly" {
		t.Fatalf("schedule did not move: %v", sc)
	}
	res = r.on(r.dst, modifyOf(g, &fsmpb.Insert{Id: "again", Queue: g + "/work", Key: "d3"}))
	if res.Failure == nil {
		t.Fatal("the key reserved by a deleted task's dedup window was free at the target")
	}
	// The claimed task can be committed at the target by its claimant.
	claimed := true
	list, _, err := r.dst.List(g+"/work", "", 1000, &claimed, false)
	if err != nil || len(list) != 2 || list[0].Claimant != "w1" {
		t.Fatalf("the claimed tasks did not move with their claimant: %v (%v)", list, err)
	}
	held := list[0]
	r.ok(r.dst, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: g, Claimant: "w1", Deletes: []*fsmpb.Ref{{Id: held.Id, Version: held.Version}}}})

	// The source drops its copy a few tasks per step; other slots stay.
	steps := 0
	for done := false; !done; steps++ {
		c := slotCmd(fsmpb.SlotCommand_DROP, slot, move)
		c.Limit = 7
		res := r.ok(r.src, slotOp(c))
		done = res.GetSlot().GetDone()
		if !done && res.GetSlot().GetDropped() != 7 {
			t.Fatalf("a step dropped %d tasks, want 7", res.GetSlot().GetDropped())
		}
	}
	if steps < 10 {
		t.Fatalf("dropped in %d steps of 7 tasks, want many", steps)
	}
	if got := slotTasks(r.src, slot); len(got) != 0 {
		t.Fatalf("the source still holds %d tasks of the slot", len(got))
	}
	if sc := r.src.Schedules(g); len(sc) != 0 {
		t.Fatalf("the source kept the slot's schedules: %v", sc)
	}
	if qs := r.src.Queues(groups[1]+"/work", 1); len(qs) == 1 && qs[0].Paused {
		t.Fatal("the source kept the slot's pause")
	}
	otherAfter := slotTasks(r.src, SlotOf(other, testSlots))
	if len(otherAfter) != len(otherBefore)+1 {
		t.Fatalf("the other slot holds %d tasks, want %d", len(otherAfter), len(otherBefore)+1)
	}
	ss := r.src.SlotStates()
	if len(ss) != 1 || ss[0].Phase != fsmpb.SlotState_GONE || ss[0].To != 2 {
		t.Fatalf("source slot states %v, want slot %d gone to shard 2", ss, slot)
	}
	if res := r.on(r.src, modifyOf(g, &fsmpb.Insert{Id: "late", Queue: g + "/work"})); res.GetFailure().GetMoved().GetPhase() != fsmpb.SlotState_GONE {
		t.Fatalf("a write routed by an old table to the source: %v, want refused", res)
	}
	if len(r.dst.SlotStates()) != 0 {
		t.Fatalf("target slot states %v, want none", r.dst.SlotStates())
	}
}

// A move abandoned before the flip leaves both shards as they were: the
// target drops what it imported, the source serves the slot again.
func TestSlotMoveRollsBack(t *testing.T) { onEachStore(t, slotMoveRollsBack) }

func slotMoveRollsBack(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	r := newSlotRig(t, newMachine)
	const slot, move = 3, 9
	groups, _ := groupsIn(slot, 1)
	g := groups[0]
	for i := range 20 {
		r.ok(r.src, modifyOf(g, &fsmpb.Insert{Id: fmt.Sprint(i), Queue: g + "/q"}))
	}
	want := slotTasks(r.src, slot)
	r.ok(r.src, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, slot, move)))
	ch, err := r.src.ExportSlot(slot, testSlots, move, SlotCursor{}, 200)
	if err != nil || ch.Done {
		t.Fatalf("first chunk: done %v, err %v", ch.Done, err)
	}
	c := slotCmd(fsmpb.SlotCommand_IMPORT, slot, move)
	c.Records = ch.Records
	r.ok(r.dst, slotOp(c))
	// Activating with another move's id is refused.
	if res := r.on(r.dst, slotOp(slotCmd(fsmpb.SlotCommand_ACTIVATE, slot, move+1))); res.Failure == nil {
		t.Fatal("an activation of another move was applied")
	}
	for done := false; !done; {
		d := slotCmd(fsmpb.SlotCommand_DROP, slot, move)
		d.Limit = 2
		done = r.ok(r.dst, slotOp(d)).GetSlot().GetDone()
	}
	if got := slotTasks(r.dst, slot); len(got) != 0 {
		t.Fatalf("the target kept %d tasks of an abandoned import", len(got))
	}
	r.ok(r.src, slotOp(slotCmd(fsmpb.SlotCommand_UNFREEZE, slot, move)))
	r.ok(r.src, modifyOf(g, &fsmpb.Insert{Id: "after", Queue: g + "/q"}))
	if got := slotTasks(r.src, slot); len(got) != len(want)+1 {
		t.Fatalf("the source holds %d tasks after the rollback, want %d", len(got), len(want)+1)
	}
	// The target can import the slot again later (a new move).
	r.ok(r.src, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, slot, move+1)))
	r.move(slot, move+1, 1<<20)
	r.ok(r.dst, slotOp(slotCmd(fsmpb.SlotCommand_ACTIVATE, slot, move+1)))
	if got, want := slotTasks(r.dst, slot), slotTasks(r.src, slot); !slices.Equal(got, want) {
		t.Fatalf("second move: target holds %d tasks, source %d", len(got), len(want))
	}
}

// Steps out of order, of another move or below the format are refused and
// change nothing.
func TestSlotStepsRefused(t *testing.T) { onEachStore(t, slotStepsRefused) }

func slotStepsRefused(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	r := newSlotRig(t, newMachine)
	const slot = 11
	groups, _ := groupsIn(slot, 1)
	g := groups[0]
	r.ok(r.src, modifyOf(g, &fsmpb.Insert{Id: "a", Queue: g + "/q"}))
	r.ok(r.dst, modifyOf(g, &fsmpb.Insert{Id: "a", Queue: g + "/q"}))

	old := New(Options{})
	if res := old.ApplyCommand(1, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, slot, 1))); res.Failure == nil || len(old.SlotStates()) != 0 {
		t.Fatalf("OP_SLOT below FormatSlotMoves: %v", res)
	}
	before := r.dst.Digest()
	stay := r.now // refused steps at the same time: the clock does not move either
	begin := slotCmd(fsmpb.SlotCommand_IMPORT, slot, 1)
	later := slotCmd(fsmpb.SlotCommand_IMPORT, slot, 1)
	later.Chunk = 1
	for name, c := range map[string]*fsmpb.SlotCommand{
		"import into a served slot that holds tasks": begin,
		"import without begin":                       later,
		"drop a served slot":                         {Action: fsmpb.SlotCommand_DROP, Slot: slot, Slots: testSlots, Move: 1},
		"slot out of range":                          {Action: fsmpb.SlotCommand_FREEZE, Slot: testSlots, Slots: testSlots, Move: 1},
		"no move id":                                 {Action: fsmpb.SlotCommand_FREEZE, Slot: slot, Slots: testSlots},
	} {
		cmd := slotOp(c)
		cmd.Now = stay
		if res := r.on(r.dst, cmd); res.Failure == nil {
			t.Errorf("%s: applied", name)
		}
	}
	if r.dst.Digest() != before {
		t.Fatal("refused steps changed the state")
	}

	r.ok(r.src, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, slot, 1)))
	r.ok(r.src, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, slot, 1))) // again: no change
	if res := r.on(r.src, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, slot, 2))); res.Failure == nil {
		t.Fatal("a second move froze a slot another move holds")
	}
	if _, err := r.src.ExportSlot(slot, testSlots, 2, SlotCursor{}, 1<<20); err == nil {
		t.Fatal("export for another move was allowed")
	}
	if _, err := r.src.ExportSlot(slot+1, testSlots, 1, SlotCursor{}, 1<<20); err == nil {
		t.Fatal("export of a slot that is not frozen was allowed")
	}

	// An import whose records clash with the target is refused whole.
	empty := newSlotRig(t, newMachine)
	ch, err := r.src.ExportSlot(slot, testSlots, 1, SlotCursor{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	empty.ok(empty.dst, modifyOf("elsewhere", &fsmpb.Insert{Id: "z", Queue: "elsewhere/q"}))
	c := slotCmd(fsmpb.SlotCommand_IMPORT, slot, 1)
	c.Records = append(slices.Clone(ch.Records), ch.Records[0]) // the same task twice
	before = empty.dst.Digest()
	cmd := slotOp(c)
	cmd.Now = empty.now
	if res := empty.on(empty.dst, cmd); res.Failure == nil {
		t.Fatal("an import holding one task twice was applied")
	}
	if empty.dst.Digest() != before || len(empty.dst.SlotStates()) != 0 {
		t.Fatal("a refused import changed the state")
	}
	c.Records = []*fsmpb.SnapshotRecord{{Task: &fsmpb.Task{Id: "q", Queue: "elsewhere/q", Version: 1}}}
	if res := empty.on(empty.dst, slotOp(c)); res.Failure == nil {
		t.Fatal("an import of a task of another slot was applied")
	}
}

// Slot states, the slot table and sessions' groups survive a snapshot, and
// the digest sees them.
func TestSlotStatesSurviveSnapshot(t *testing.T) { onEachStore(t, slotStatesSurviveSnapshot) }

func slotStatesSurviveSnapshot(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	r := newSlotRig(t, newMachine)
	groups, _ := groupsIn(5, 1)
	r.ok(r.src, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, ClientId: "c", Seq: 1, Modify: &fsmpb.Modify{Group: groups[0], Inserts: []*fsmpb.Insert{{Id: "a", Queue: groups[0] + "/q"}}}})
	plain := r.src.Digest()
	c := slotCmd(fsmpb.SlotCommand_FREEZE, 5, 77)
	c.To = 4
	r.ok(r.src, slotOp(c))
	if r.src.Digest() == plain {
		t.Fatal("the digest does not see a frozen slot")
	}
	var buf bytes.Buffer
	snap, _ := r.src.Snapshot()
	if err := snap.(*snapshot).writeTo(&buf); err != nil {
		t.Fatal(err)
	}
	m := New(Options{})
	if err := m.Restore(io.NopCloser(bytes.NewReader(buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if m.Digest() != r.src.Digest() {
		t.Fatal("digest differs after a restore")
	}
	ss := m.SlotStates()
	if len(ss) != 1 || ss[0].Slot != 5 || ss[0].Phase != fsmpb.SlotState_FROZEN || ss[0].Move != 77 || ss[0].To != 4 {
		t.Fatalf("restored slot states %v", ss)
	}
	if res := m.ApplyCommand(100, modifyOf(groups[0], &fsmpb.Insert{Id: "b", Queue: groups[0] + "/q"})); res.GetFailure().GetMoved() == nil {
		t.Fatalf("the restored machine serves the frozen slot: %v", res)
	}
	if _, err := m.ExportSlot(5, testSlots, 77, SlotCursor{}, 1<<20); err != nil {
		t.Fatalf("export after restore: %v", err)
	}
	m.mu.RLock()
	group := m.st.store.session("c").group
	m.mu.RUnlock()
	if group != groups[0] {
		t.Fatalf("restored session's group %q, want %q", group, groups[0])
	}
}

// Below FormatSlotMoves a session keeps no group, so that replicas of older
// binaries, which do not know it, reach the same state and digest.
func TestSessionGroupOnlyFromFormatSlotMoves(t *testing.T) {
	m := New(Options{})
	m.ApplyCommand(1, SetFormatCommand(FormatQueueControls))
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, ClientId: "c", Seq: 1, Now: 5, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g/q"}}}})
	m.mu.RLock()
	group := m.st.store.session("c").group
	m.mu.RUnlock()
	if group != "" {
		t.Fatalf("format %d session remembers group %q", FormatQueueControls, group)
	}
}

// A read every shard answers (GetServed) covers each slot exactly once
// only while no slot moves between the answers: a task of a moving slot
// is then either in exactly one answer, or the answers say the read must
// be asked again.
func TestGetServedCoversEachSlotOnce(t *testing.T) { onEachStore(t, getServedCoversEachSlotOnce) }

func getServedCoversEachSlotOnce(t *testing.T, newMachine func(testing.TB, Options) *Machine) {
	r := newSlotRig(t, newMachine)
	const slot, move = 9, 3
	groups, _ := groupsIn(slot, 1)
	g := groups[0]
	r.ok(r.src, modifyOf(g, &fsmpb.Insert{Id: "x", Queue: g + "/q"}))
	old := make([]uint32, testSlots) // slot -> shard: src is 1, dst is 2
	for s := range old {
		old[s] = uint32(s%2 + 1)
	}
	old[slot] = 1
	flipped := slices.Clone(old)
	flipped[slot] = 2
	bit := func(m []byte, s int) bool { return m[s/8]&(1<<(s%8)) != 0 }
	type answer struct {
		tasks  int
		served []byte
	}
	read := func(m *Machine, table []uint32, shard uint32) answer {
		ts, served := m.GetServed([]string{"x"}, table, shard)
		return answer{len(ts), served}
	}
	covered := func(a, b answer) int {
		n := 0
		if bit(a.served, slot) {
			n++
		}
		if bit(b.served, slot) {
			n++
		}
		return n
	}
	steps := []struct {
		name          string
		do            func()
		srcTab        []uint32
		dstTab        []uint32
		covered, hits int // how many answers cover the slot; tasks found
	}{
		{"before the move", func() {}, old, old, 1, 1},
		{"frozen, old table", func() { r.ok(r.src, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, slot, move))) }, old, old, 1, 1},
		{"importing, flipped table", func() { r.move(slot, move, 1<<20) }, flipped, flipped, 0, 0},
		{"active at the target, source read with the old table", func() {
			r.ok(r.dst, slotOp(slotCmd(fsmpb.SlotCommand_ACTIVATE, slot, move)))
		}, old, flipped, 2, 2},
		{"dropped at the source", func() {
			r.ok(r.src, slotOp(slotCmd(fsmpb.SlotCommand_DROP, slot, move)))
		}, old, flipped, 1, 1},
	}
	for _, st := range steps {
		st.do()
		a, b := read(r.src, st.srcTab, 1), read(r.dst, st.dstTab, 2)
		if c := covered(a, b); c != st.covered || a.tasks+b.tasks != st.hits {
			t.Fatalf("%s: the slot is covered by %d answers holding %d tasks; want %d and %d", st.name, c, a.tasks+b.tasks, st.covered, st.hits)
		}
		// Every other slot is covered exactly once by the table's shard.
		for s := range testSlots {
			if s != slot && bit(a.served, s) == bit(b.served, s) {
				t.Fatalf("%s: slot %d covered by both or neither", st.name, s)
			}
		}
	}
}

// onEachStore runs a test on a machine of each store.
func onEachStore(t *testing.T, test func(*testing.T, func(testing.TB, Options) *Machine)) {
	t.Run("memory", func(t *testing.T) { test(t, memMachine) })
	t.Run("ondisk", func(t *testing.T) { test(t, diskMachine) })
}
