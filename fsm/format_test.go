package fsm

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// groupInsert inserts task id into group's queue group/q.
func groupInsert(now int64, group, id string) *fsmpb.Command {
	return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: &fsmpb.Modify{Group: group,
		Inserts: []*fsmpb.Insert{{Id: id, Queue: group + "/q", Value: []byte(group)}}}}
}

func failureCategories(res *fsmpb.Result) []string {
	var out []string
	for _, e := range res.GetFailure().GetErrors() {
		out = append(out, e.Category.String())
	}
	return out
}

// TestFormatGroupIDs pins the two id rules: before FormatGroupIDs an id is
// unique in the shard; after, per group, and every reference reaches only
// its own group's task.
func TestFormatGroupIDs(t *testing.T) {
	m := newMachine(t, Options{})
	if m.Format() != FormatShardIDs {
		t.Fatalf("a new machine is at format %d, want %d", m.Format(), FormatShardIDs)
	}
	if res := m.ApplyCommand(1, groupInsert(10, "g", "x")); res.Failure != nil {
		t.Fatal(res.Failure)
	}
	res := m.ApplyCommand(2, groupInsert(11, "h", "x"))
	if got := failureCategories(res); len(got) != 1 || got[0] != "INSERT_DUPLICATE_ID" {
		t.Fatalf("format 0: the id of another group's task: %v, want INSERT_DUPLICATE_ID", res)
	}

	m.ApplyCommand(3, SetFormatCommand(FormatGroupIDs))
	if m.Format() != FormatGroupIDs {
		t.Fatalf("format %d after OP_SET_FORMAT, want %d", m.Format(), FormatGroupIDs)
	}
	if res := m.ApplyCommand(4, groupInsert(12, "h", "x")); res.Failure != nil {
		t.Fatalf("format 1: the same id in another group: %v", res.Failure)
	}
	if res := m.ApplyCommand(5, groupInsert(13, "h", "x")); len(failureCategories(res)) != 1 {
		t.Fatalf("format 1: the same id twice in one group: %v, want INSERT_DUPLICATE_ID", res)
	}
	if m.TaskCount() != 2 {
		t.Fatalf("TaskCount %d, want 2", m.TaskCount())
	}
	got := m.Get([]string{"x"})
	if len(got) != 2 || got[0].Queue != "g/q" || got[1].Queue != "h/q" {
		t.Fatalf("Get(x) = %v, want the tasks of g/q and h/q in that order", got)
	}

	// A change in h reaches h's task only; a delete in g, g's only.
	res = m.ApplyCommand(6, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 14, Modify: &fsmpb.Modify{Group: "h",
		Changes: []*fsmpb.Change{{Id: "x", Version: 1, Value: []byte("h changed")}}}})
	if res.Failure != nil {
		t.Fatal(res.Failure)
	}
	got = m.Get([]string{"x"})
	if string(got[0].Value) != "g" || got[0].Version != 1 || string(got[1].Value) != "h changed" || got[1].Version != 2 {
		t.Fatalf("after a change in h: %v", got)
	}
	res = m.ApplyCommand(7, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 15, Modify: &fsmpb.Modify{Group: "g",
		Deletes: []*fsmpb.Ref{{Id: "x", Version: 2}}}})
	if got := failureCategories(res); len(got) != 1 || got[0] != "DELETE_STALE" {
		t.Fatalf("a delete in g naming h's version: %v, want DELETE_STALE (g's task is at 1)", res)
	}

	// A claim of h/q, then a snapshot round trip keeps both and the format.
	res = m.ApplyCommand(8, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 16, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"h/q"}, Lease: 100, Limit: 5}})
	if len(res.GetClaim().GetTasks()) != 1 || res.Claim.Tasks[0].Queue != "h/q" {
		t.Fatalf("claim of h/q: %v", res)
	}
	r := newMachine(t, Options{})
	if err := r.Restore(io.NopCloser(bytes.NewReader(persist(t, m)))); err != nil {
		t.Fatal(err)
	}
	if r.Format() != FormatGroupIDs || r.TaskCount() != 2 || r.Digest() != m.Digest() {
		t.Fatalf("restored: format %d, %d tasks, digest equal %v", r.Format(), r.TaskCount(), r.Digest() == m.Digest())
	}

	res = m.ApplyCommand(9, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 17, Modify: &fsmpb.Modify{Group: "g",
		Deletes: []*fsmpb.Ref{{Id: "x", Version: 1}}}})
	if res.Failure != nil {
		t.Fatal(res.Failure)
	}
	if got := m.Get([]string{"x"}); len(got) != 1 || got[0].Queue != "h/q" {
		t.Fatalf("after deleting g's x: %v, want h's only", got)
	}
	if res := m.ApplyCommand(10, &fsmpb.Command{Op: fsmpb.Op_OP_PURGE, Now: 18, Purge: &fsmpb.Purge{Queue: "h/q"}}); res.GetPurge().GetDeleted() != 1 {
		t.Fatalf("purge h/q: %v", res)
	}
	if m.TaskCount() != 0 || len(m.Get([]string{"x"})) != 0 {
		t.Fatalf("after purge: %d tasks", m.TaskCount())
	}
}

// TestFormatNeverGoesDown: a lower or equal OP_SET_FORMAT changes nothing.
func TestFormatNeverGoesDown(t *testing.T) {
	m := newMachine(t, Options{})
	m.ApplyCommand(1, SetFormatCommand(MaxFormat))
	m.ApplyCommand(2, SetFormatCommand(FormatShardIDs))
	if m.Format() != MaxFormat {
		t.Fatalf("format %d after a lower OP_SET_FORMAT, want %d", m.Format(), MaxFormat)
	}
}

// TestFormatNewerThanBinary: an entry raising the format past what this
// binary applies is refused at decode, and Apply stops rather than apply
// later entries by rules it does not know.
func TestFormatNewerThanBinary(t *testing.T) {
	data, err := EncodeCommand(SetFormatCommand(MaxFormat + 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeCommand(data); err == nil || !strings.Contains(err.Error(), "newer than this version") {
		t.Fatalf("DecodeCommand: %v, want a refusal of the newer format", err)
	}
	defer func() {
		if p := recover(); p == nil {
			t.Fatal("Apply of a newer format did not stop")
		}
	}()
	newMachine(t, Options{}).Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: data})
}

// TestFormatDigest: a state of format 0 hashes as it did before formats
// existed (replicas of the previous binary compare checkpoints with it
// during an upgrade), and raising the format changes the digest.
func TestFormatDigest(t *testing.T) {
	m := fixtureMachine(t)
	// The fixture's digest as the binary before state formats computed it.
	const before = "3d932420f7648341d9644d889cea3246e346fb3e892bef1dbbdc3cc08fec0fd8"
	d := m.Digest()
	if got := hex.EncodeToString(d[:]); got != before {
		t.Fatalf("format 0 digest %s, want %s (unchanged from older binaries)", got, before)
	}
	m.ApplyCommand(m.AppliedIndex()+1, SetFormatCommand(FormatGroupIDs))
	if m.Digest() == d {
		t.Fatal("raising the format left the digest unchanged: replicas that disagree on it would compare equal")
	}
}

// TestSnapshotStateFormat: a state above format 0 is written in stream
// format 2, which binaries older than formats refuse; the header's two
// formats must agree; a state format this binary does not apply is refused
// with advice to upgrade, not as corruption.
func TestSnapshotStateFormat(t *testing.T) {
	header := func(data []byte) *fsmpb.SnapshotHeader {
		sr := &snapshotReader{r: bufio.NewReader(bytes.NewReader(data[len(snapshotMagic):]))}
		rec, _, err := sr.next()
		if err != nil {
			t.Fatal(err)
		}
		p, err := parseRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		return p.header
	}
	m := fixtureMachine(t)
	if h := header(persist(t, m)); h.Format != snapshotFormat || h.StateFormat != 0 {
		t.Fatalf("format 0 header: %v", h)
	}
	m.ApplyCommand(m.AppliedIndex()+1, SetFormatCommand(FormatGroupIDs))
	if h := header(persist(t, m)); h.Format != snapshotFormatStated || h.StateFormat != FormatGroupIDs {
		t.Fatalf("format 1 header: %v", h)
	}

	for _, tc := range []struct {
		name          string
		stream, state uint32
		corrupt       bool
	}{
		{"stream 1 with a state format", snapshotFormat, FormatGroupIDs, true},
		{"stream 2 without one", snapshotFormatStated, 0, true},
		{"a newer state format", snapshotFormatStated, MaxFormat + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := streamWithHeader(t, &fsmpb.SnapshotHeader{Format: tc.stream, StateFormat: tc.state})
			err := newMachine(t, Options{}).Restore(io.NopCloser(bytes.NewReader(data)))
			if err == nil || errors.Is(err, ErrCorruptSnapshot) != tc.corrupt {
				t.Fatalf("Restore: %v, corrupt wanted %v", err, tc.corrupt)
			}
			if !tc.corrupt && !strings.Contains(err.Error(), "upgrade") {
				t.Fatalf("Restore: %v, want advice to upgrade", err)
			}
		})
	}
}

// streamWithHeader is an intact snapshot stream of no tasks and no
// sessions with header h.
func streamWithHeader(t *testing.T, h *fsmpb.SnapshotHeader) []byte {
	var buf bytes.Buffer
	sw := &snapshotWriter{w: bufio.NewWriter(&buf)}
	if err := sw.write([]byte(snapshotMagic)); err != nil {
		t.Fatal(err)
	}
	if err := sw.record(&fsmpb.SnapshotRecord{Header: h}); err != nil {
		t.Fatal(err)
	}
	if err := sw.record(&fsmpb.SnapshotRecord{Trailer: &fsmpb.SnapshotTrailer{Crc32C: sw.crc}}); err != nil {
		t.Fatal(err)
	}
	if err := sw.w.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestHeldInsert: from FormatQueueControls an insert with held and a future
// at is claimed by the Modify's claimant until then (others' changes are
// refused as CLAIMED, its own go through), and available to all after; below
// that format the field is ignored, as binaries that do not know it ignore it.
func TestHeldInsert(t *testing.T) {
	held := func(now int64, id string) *fsmpb.Command {
		return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: &fsmpb.Modify{Group: "g", Claimant: "producer",
			Inserts: []*fsmpb.Insert{{Id: id, Queue: "g/q", At: now + 100, Held: true}}}}
	}
	m := newMachine(t, Options{})
	m.ApplyCommand(1, SetFormatCommand(FormatGroupIDs))
	if res := m.ApplyCommand(2, held(10, "old")); res.GetModify().GetInserted()[0].GetClaimant() != "" {
		t.Fatalf("format %d: a held insert was claimed: %v", FormatGroupIDs, res)
	}
	m.ApplyCommand(3, SetFormatCommand(FormatQueueControls))
	res := m.ApplyCommand(4, held(20, "h"))
	if got := res.GetModify().GetInserted(); len(got) != 1 || got[0].Claimant != "producer" || got[0].At != 120 {
		t.Fatalf("held insert: %v, want claimed by producer until 120", res)
	}
	if st := m.Queues("g/q", 0); len(st) != 1 || st[0].Claimed != 1 || st[0].Delayed != 1 {
		t.Fatalf("stats %+v, want the held task claimed and the other delayed", st)
	}
	change := func(now int64, claimant string, version uint64) *fsmpb.Result {
		return m.ApplyCommand(uint64(now), &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: &fsmpb.Modify{Group: "g", Claimant: claimant,
			Changes: []*fsmpb.Change{{Id: "h", Version: version, KeepClaim: true, Value: []byte(claimant)}}}})
	}
	if got := failureCategories(change(30, "other", 1)); len(got) != 1 || got[0] != "CLAIMED" {
		t.Fatalf("another's change of a held task: %v, want CLAIMED", got)
	}
	if res := change(40, "producer", 1); res.Failure != nil {
		t.Fatalf("the producer's change of its held task: %v", res.Failure)
	}
	res = m.ApplyCommand(200, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 200, Claim: &fsmpb.Claim{Claimant: "worker", Queues: []string{"g/q"}, Lease: 10, Limit: 5}})
	if got := res.GetClaim().GetTasks(); len(got) != 2 {
		t.Fatalf("after their time a worker claimed %v, want both tasks", got)
	}
}

// TestDedupWindow: from FormatQueueControls a deleted task's key stays
// reserved for its dedup window (an insert of it fails, naming the deleted
// task; with if_absent it returns the deleted version), also after a purge;
// the window ends by log time; a request that deletes the task and inserts
// the key again takes it; below the format the window is ignored.
func TestDedupWindow(t *testing.T) {
	ins := func(now int64, id string, window int64, ifAbsent bool) *fsmpb.Command {
		return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: &fsmpb.Modify{Group: "g",
			Inserts: []*fsmpb.Insert{{Id: id, Queue: "g/q", Key: "k", DedupWindow: window, IfAbsent: ifAbsent}}}}
	}
	del := func(now int64, id string, version uint64) *fsmpb.Command {
		return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: &fsmpb.Modify{Group: "g", Deletes: []*fsmpb.Ref{{Id: id, Version: version}}}}
	}
	apply := func(m *Machine, cmd *fsmpb.Command) *fsmpb.Result {
		res := m.ApplyCommand(m.AppliedIndex()+1, cmd)
		return res
	}

	old := newMachine(t, Options{})
	apply(old, SetFormatCommand(FormatGroupIDs))
	apply(old, ins(10, "a", 100, false))
	apply(old, del(11, "a", 1))
	if res := apply(old, ins(12, "b", 0, false)); res.Failure != nil {
		t.Fatalf("format %d: the key of a deleted task is free: %v", FormatGroupIDs, res.Failure)
	}

	m := newMachine(t, Options{})
	apply(m, SetFormatCommand(FormatQueueControls))
	apply(m, ins(10, "a", 100, false))
	apply(m, del(20, "a", 1))
	res := apply(m, ins(30, "b", 0, false))
	if errs := res.GetFailure().GetErrors(); len(errs) != 1 || errs[0].Category != fsmpb.RefError_INSERT_DUPLICATE_KEY || errs[0].ExistingId != "a" {
		t.Fatalf("insert of a reserved key: %v, want INSERT_DUPLICATE_KEY naming a", res)
	}
	res = apply(m, ins(31, "c", 0, true))
	if got := res.GetModify(); len(got.GetCoalesced()) != 1 || got.Inserted[0].Id != "a" || m.TaskCount() != 0 {
		t.Fatalf("if_absent insert of a reserved key: %v, want the deleted a, nothing inserted", res)
	}
	// The window ends 100 after the delete, by log time.
	if res := apply(m, ins(119, "d", 0, false)); res.Failure == nil {
		t.Fatal("the key was free before its window ended")
	}
	if res := apply(m, ins(120, "e", 50, false)); res.Failure != nil {
		t.Fatalf("the key after its window: %v", res.Failure)
	}
	// Purge reserves too; a request that deletes the holder and inserts the
	// key again takes it.
	apply(m, &fsmpb.Command{Op: fsmpb.Op_OP_PURGE, Now: 130, Purge: &fsmpb.Purge{Queue: "g/q"}})
	if res := apply(m, ins(140, "f", 0, false)); res.Failure == nil {
		t.Fatal("the key of a purged task was free within its window")
	}
	apply(m, ins(200, "g1", 500, false))
	res = apply(m, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 210, Modify: &fsmpb.Modify{Group: "g",
		Deletes: []*fsmpb.Ref{{Id: "g1", Version: 1}}, Inserts: []*fsmpb.Insert{{Id: "g2", Queue: "g/q", Key: "k"}}}})
	if res.Failure != nil {
		t.Fatalf("delete and re-insert of a key in one request: %v", res.Failure)
	}
	// The reservation survives a snapshot.
	apply(m, del(220, "g2", 1))
	apply(m, ins(230, "h", 300, false))
	apply(m, del(240, "h", 1))
	r := newMachine(t, Options{})
	if err := r.Restore(io.NopCloser(bytes.NewReader(persist(t, m)))); err != nil {
		t.Fatal(err)
	}
	if r.Digest() != m.Digest() {
		t.Fatal("restored digest differs")
	}
	if res := r.ApplyCommand(r.AppliedIndex()+1, ins(250, "i", 0, false)); res.Failure == nil {
		t.Fatal("a restored replica lost the reservation")
	}
}

// TestSchedule: a schedule's tick inserts one task whatever number of
// leaders fire it (only the tick the state expects applies), a late tick
// without catch-up moves on without inserting, a put keeps the count of
// fired ticks, a remove ends it, and schedules survive a snapshot.
func TestSchedule(t *testing.T) {
	m := newMachine(t, Options{})
	apply := func(now int64, cmd *fsmpb.Command) *fsmpb.Result {
		cmd.Now = now
		return m.ApplyCommand(m.AppliedIndex()+1, cmd)
	}
	put := &fsmpb.Schedule{Name: "nightly", Queue: "rep/run", Every: 100, Value: []byte("go"), Next: 100}
	if res := apply(10, &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: put}); res.GetSchedule().GetExisted() {
		t.Fatalf("a new schedule existed: %v", res)
	}
	fire := func(now, tick, next int64, insert bool) *fsmpb.Result {
		return apply(now, &fsmpb.Command{Op: fsmpb.Op_OP_FIRE, Fire: &fsmpb.Fire{Queue: "rep/run", Name: "nightly", Tick: tick, Next: next, Insert: insert}})
	}
	if due := m.DueSchedules(99); len(due) != 0 {
		t.Fatalf("due before its tick: %v", due)
	}
	if due := m.DueSchedules(100); len(due) != 1 || due[0].Next != 100 {
		t.Fatalf("due at its tick: %v", due)
	}
	res := fire(101, 100, 200, true)
	if got := res.GetModify().GetInserted(); len(got) != 1 || got[0].Id != "nightly@1970-01-01T00:00:00.0000001Z" || string(got[0].Value) != "go" {
		t.Fatalf("first fire: %v", res)
	}
	if res := fire(102, 100, 200, true); res.Modify != nil {
		t.Fatalf("the same tick fired twice inserted again: %v", res)
	}
	if m.TaskCount() != 1 {
		t.Fatalf("%d tasks after one tick fired twice", m.TaskCount())
	}
	// Late, without catch-up: next moves, nothing is inserted.
	if res := fire(450, 200, 500, false); res.Modify != nil || m.TaskCount() != 1 {
		t.Fatalf("a skipped tick inserted: %v", res)
	}
	put2 := &fsmpb.Schedule{Name: "nightly", Queue: "rep/run", Every: 50, Next: 500}
	if res := apply(460, &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: put2}); !res.GetSchedule().GetExisted() {
		t.Fatalf("a put over a schedule: %v", res)
	}
	s := m.Schedules("rep/")
	if len(s) != 1 || s[0].Every != 50 || s[0].Fired != 1 || s[0].Last != 200 {
		t.Fatalf("after a put: %v, want every 50, fired 1, last 200", s)
	}
	r := newMachine(t, Options{})
	if err := r.Restore(io.NopCloser(bytes.NewReader(persist(t, m)))); err != nil {
		t.Fatal(err)
	}
	if r.Digest() != m.Digest() || len(r.Schedules("")) != 1 {
		t.Fatal("a snapshot lost the schedule")
	}
	// A request naming another queue of the group reaches no schedule of
	// that name: the API authorized it for that queue only.
	res = apply(470, &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: &fsmpb.Schedule{Name: "nightly", Queue: "rep/x", Remove: true}})
	if res.Failure == nil || !strings.HasPrefix(res.Failure.Message, ScheduleElsewhere) || len(m.Schedules("")) != 1 {
		t.Fatalf("a remove through another queue of the group: %v", res)
	}
	apply(471, &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: &fsmpb.Schedule{Name: "nightly", Queue: "rep/run", Remove: true}})
	if len(m.Schedules("")) != 0 || len(m.DueSchedules(1<<62)) != 0 {
		t.Fatal("a removed schedule is still there")
	}
}
