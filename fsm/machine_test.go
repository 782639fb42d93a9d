package fsm

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"io"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

func insertCmd(now int64, ids ...string) *fsmpb.Command {
	m := &fsmpb.Modify{Group: "g"}
	for _, id := range ids {
		m.Inserts = append(m.Inserts, &fsmpb.Insert{Id: id, Queue: "g/q", Value: []byte("v-" + id)})
	}
	return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: m}
}

func TestExactlyOnce(t *testing.T) {
	m := newMachine(t, Options{})
	m.ApplyCommand(1, insertCmd(10, "a", "b"))
	claim := &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 20, ClientId: "c", Seq: 1,
		Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 1}}
	first := m.ApplyCommand(2, claim)
	before := m.Digest()
	// The retry arrives later, through the log, as a new entry.
	data, err := EncodeCommand(claim)
	if err != nil {
		t.Fatal(err)
	}
	second := m.Apply(&raft.Log{Index: 3, Type: raft.LogCommand, Data: data}).(*fsmpb.Result)
	if !second.Replayed || first.Replayed {
		t.Fatalf("replayed: first %v, retry %v; want false, true", first.Replayed, second.Replayed)
	}
	second.Replayed = false
	if !proto.Equal(first, second) {
		t.Fatalf("retry returned %v, want %v", second, first)
	}
	if got := first.GetClaim().GetTasks(); len(got) != 1 || got[0].Id != "a" || got[0].Version != 2 {
		t.Fatalf("claimed %v, want a v2", got)
	}
	if m.Digest() != before {
		t.Fatal("the retry changed the state")
	}
	tasks := m.Get([]string{"a", "b"})
	if tasks[0].Claims != 1 || tasks[1].Claims != 0 || tasks[1].Version != 1 {
		t.Fatalf("after retry: %v", tasks)
	}
	if m.AppliedIndex() != 3 {
		t.Fatalf("applied index %d, want 3", m.AppliedIndex())
	}
	// A stale sequence number is refused without effect.
	claim.Seq = 0
	if res := m.ApplyCommand(4, claim); res.GetFailure().GetMessage() != StaleSequenceMessage {
		t.Fatalf("stale seq: %v", res)
	}
	if m.Digest() != before {
		t.Fatal("a stale request changed the state")
	}
}

func TestSessionTTLAndEviction(t *testing.T) {
	m := newMachine(t, Options{MaxSessions: 2, SessionTTL: 100})
	tick := func(now int64, client string, seq uint64) *fsmpb.Result {
		return m.ApplyCommand(0, &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: now, ClientId: client, Seq: seq})
	}
	tick(10, "b", 5)
	tick(10, "a", 5)
	tick(20, "c", 5) // evicts a: least recently seen, ties by client id
	if res := tick(21, "a", 4); res.Failure != nil {
		t.Fatalf("evicted session still refuses seq 4: %v", res)
	}
	if res := tick(22, "c", 4); res.GetFailure().GetMessage() != StaleSequenceMessage {
		t.Fatalf("kept session: %v", res)
	}
	// c was last seen at 22: at 122 it is kept, at 123 it is gone.
	tick(122, "", 0)
	if res := tick(122, "c", 4); res.Failure == nil {
		t.Fatal("session expired early")
	}
	tick(223, "", 0)
	if res := tick(223, "c", 4); res.Failure != nil {
		t.Fatalf("session did not expire: %v", res)
	}
}

// TestSessionsBoundedByBytes: answers that carry large values evict the
// least recently seen sessions once their sizes pass MaxSessionBytes, the
// newest answer is still replayed, and a snapshot restores the same count
// (three requests with 1 GB answers grew a snapshot to 3.1 GB).
func TestSessionsBoundedByBytes(t *testing.T) {
	const limit = 3 << 20
	m := newMachine(t, Options{MaxSessionBytes: limit})
	value := make([]byte, 1<<20)
	insert := func(i int) *fsmpb.Result {
		id := fmt.Sprintf("t%d", i)
		return m.ApplyCommand(uint64(i+1), &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: int64(10 + i), ClientId: fmt.Sprintf("c%d", i), Seq: 1,
			Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{{Id: id, Queue: "g/q", Value: value}}}})
	}
	for i := range 10 {
		if res := insert(i); res.Failure != nil {
			t.Fatal(res.Failure)
		}
		if m.st.store.sessionBytes() > limit {
			t.Fatalf("after %d answers of 1 MiB the sessions hold %d bytes, over %d", i+1, m.st.store.sessionBytes(), limit)
		}
	}
	if n := m.st.store.sessionCount(); n < 2 || n > 3 {
		t.Fatalf("%d sessions kept, want 2 or 3 of 1 MiB within 3 MiB", n)
	}
	if m.st.store.session("c9") == nil || m.st.store.session("c0") != nil {
		t.Fatal("evicted the newest session, or kept the oldest")
	}
	// The newest is replayed (the same answer, nothing applied twice).
	if res := insert(9); res.Failure != nil || res.GetModify().GetInserted()[0].GetVersion() != 1 {
		t.Fatalf("retry of the newest request: %v", res)
	}
	r := newMachine(t, Options{MaxSessionBytes: limit})
	if err := r.Restore(io.NopCloser(bytes.NewReader(persist(t, m)))); err != nil {
		t.Fatal(err)
	}
	if r.st.store.sessionBytes() != m.st.store.sessionBytes() || r.st.store.sessionCount() != m.st.store.sessionCount() {
		t.Fatalf("restored %d sessions of %d bytes, had %d of %d", r.st.store.sessionCount(), r.st.store.sessionBytes(), m.st.store.sessionCount(), m.st.store.sessionBytes())
	}
}

func TestApplyIgnoresNonCommandEntries(t *testing.T) {
	m := newMachine(t, Options{})
	if res := m.Apply(&raft.Log{Index: 7, Type: raft.LogNoop}); res != nil {
		t.Fatalf("noop returned %v", res)
	}
	if m.AppliedIndex() != 7 {
		t.Fatalf("applied %d", m.AppliedIndex())
	}
}

func TestApplyPanicsOnGarbage(t *testing.T) {
	m := newMachine(t, Options{})
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(r.(string), "log entry 9") {
			t.Fatalf("recovered %v", r)
		}
	}()
	m.Apply(&raft.Log{Index: 9, Type: raft.LogCommand, Data: []byte{0x08, 0x63}}) // op 99
}

func TestOnAvailable(t *testing.T) {
	var got [][]string
	m := newMachine(t, Options{OnAvailable: func(qs []string) { got = append(got, append([]string(nil), qs...)) }})
	m.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{
		{Id: "a", Queue: "g/q"}, {Id: "b", Queue: "g/q"}, {Id: "c", Queue: "g/r", At: 50}}}})
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 11, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 5, Limit: 2}})
	m.ApplyCommand(3, &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: 60})
	want := [][]string{{"g/q", "g/r"}, {"g/q", "g/r"}}
	if len(got) != len(want) || strings.Join(got[0], ",") != "g/q,g/r" || strings.Join(got[1], ",") != "g/q,g/r" {
		t.Fatalf("notified %v, want %v", got, want)
	}
}

func TestValidate(t *testing.T) {
	modify := func(m *fsmpb.Modify) *fsmpb.Command { return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: m} }
	ins := func(id, queue string) *fsmpb.Insert { return &fsmpb.Insert{Id: id, Queue: queue} }
	claim := func(c *fsmpb.Claim) *fsmpb.Command { return &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Claim: c} }
	modifyClaim := func(m *fsmpb.Modify) *fsmpb.Command { return &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY_CLAIM, Modify: m} }
	okClaim := func() *fsmpb.Claim {
		return &fsmpb.Claim{Claimant: "w", Queues: []string{"g/a", "g"}, Lease: 1e9, Limit: 1}
	}
	big := make([]byte, 2<<20)
	tests := []struct {
		name string
		cmd  *fsmpb.Command
		want string // "" for valid
		kind error
	}{
		{"insert", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("a", "g/q"), ins("b", "g")}}), "", nil},
		{"value too large", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("a", "g"), ins("b", "g"), ins("c", "g"),
			{Id: "d", Queue: "g", Value: big}}}), "inserts[3].value: 2097152 bytes exceeds the limit of 1048576", ErrTooLarge},
		{"err too large", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{{Id: "d", Queue: "g", Err: strings.Repeat("e", 4097)}}}),
			"inserts[0].err: 4097 bytes exceeds the limit of 4096", ErrTooLarge},
		{"other group", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("a", "h/q")}}),
			`inserts[0].queue: queue "h/q" is not in consistency group "g"`, ErrInvalid},
		{"change moves out of group", modify(&fsmpb.Modify{Group: "g", Changes: []*fsmpb.Change{{Id: "a", Version: 1, Queue: "gg/x"}}}),
			`changes[0].queue: queue "gg/x" is not in consistency group "g"`, ErrInvalid},
		{"empty id", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("", "g")}}), "inserts[0].id: required", ErrInvalid},
		{"long id", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins(strings.Repeat("i", 129), "g")}}),
			"inserts[0].id: 129 bytes exceeds the limit of 128", ErrInvalid},
		{"bad utf8 queue", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("a", "g/\xff")}}), "inserts[0].queue: not valid UTF-8", ErrInvalid},
		{"empty queue", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("a", "")}}), "inserts[0].queue: required", ErrInvalid},
		{"slash queue", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("a", "/x")}}),
			`inserts[0].queue: "/x": a queue name must not start with '/' (its group would be empty)`, ErrInvalid},
		{"duplicate id", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{ins("a", "g")}, Deletes: []*fsmpb.Ref{{Id: "a", Version: 1}}}),
			`deletes[0].id: task "a" is also named by inserts[0].id`, ErrInvalid},
		{"depend may repeat", modify(&fsmpb.Modify{Group: "g", Changes: []*fsmpb.Change{{Id: "a", Version: 1}}, Depends: []*fsmpb.Ref{{Id: "a", Version: 1}}}), "", nil},
		{"version zero", modify(&fsmpb.Modify{Group: "g", Depends: []*fsmpb.Ref{{Id: "a"}}}), "depends[0].version: required (versions start at 1)", ErrInvalid},
		{"no group", modify(&fsmpb.Modify{Inserts: []*fsmpb.Insert{ins("a", "g")}}), "group: required", ErrInvalid},
		{"empty transaction", modify(&fsmpb.Modify{Group: "g"}), "modify: empty transaction", ErrInvalid},
		{"too many ops", modify(&fsmpb.Modify{Group: "g", Depends: make([]*fsmpb.Ref, 1001)}), "modify: 1001 operations exceeds the limit of 1000", ErrTooLarge},
		{"if_absent without key", modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g", IfAbsent: true}}}),
			"inserts[0].if_absent: needs a key", ErrInvalid},
		{"modify and claim", modifyClaim(&fsmpb.Modify{Group: "g", Claimant: "w", Deletes: []*fsmpb.Ref{{Id: "a", Version: 2}}, Claim: okClaim()}), "", nil},
		{"claim only", modifyClaim(&fsmpb.Modify{Group: "g", Claimant: "w", Claim: okClaim()}), "", nil},
		{"claim without its op", modify(&fsmpb.Modify{Group: "g", Claimant: "w", Claim: okClaim()}), "modify.claim: needs OP_MODIFY_CLAIM", ErrInvalid},
		{"op without its claim", modifyClaim(&fsmpb.Modify{Group: "g", Claimant: "w", Inserts: []*fsmpb.Insert{ins("a", "g")}}),
			"modify.claim: required for OP_MODIFY_CLAIM", ErrInvalid},
		{"claim in another group", modifyClaim(&fsmpb.Modify{Group: "h", Claimant: "w", Inserts: []*fsmpb.Insert{ins("a", "h")}, Claim: okClaim()}),
			`claim.queues[0]: queue "g/a" is not in consistency group "h"`, ErrInvalid},
		{"claim for someone else", modifyClaim(&fsmpb.Modify{Group: "g", Claimant: "v", Claim: okClaim()}),
			`claim.claimant: "w" differs from the modify's claimant "v"`, ErrInvalid},
		{"claim without a claimant", modifyClaim(&fsmpb.Modify{Group: "g", Claim: &fsmpb.Claim{Queues: []string{"g"}, Lease: 1, Limit: 1}}),
			"claim.claimant: required", ErrInvalid},
		{"claim lease bounds", modifyClaim(&fsmpb.Modify{Group: "g", Claimant: "w", Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Limit: 1}}),
			"claim.lease: 0s is outside (0s, 24h0m0s]", ErrInvalid},
		{"claim limit bounds", modifyClaim(&fsmpb.Modify{Group: "g", Claimant: "w", Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Lease: 1, Limit: 1001}}),
			"claim.limit: 1001 is outside [1, 1000]", ErrInvalid},
		{"claim bad queue", modifyClaim(&fsmpb.Modify{Group: "g", Claimant: "w", Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"/g"}, Lease: 1, Limit: 1}}),
			`claim.queues[0]: "/g": a queue name must not start with '/' (its group would be empty)`, ErrInvalid},
		{"claim", claim(okClaim()), "", nil},
		{"claim two groups", claim(&fsmpb.Claim{Claimant: "w", Queues: []string{"g/a", "h/a"}, Lease: 1, Limit: 1}),
			`queues[1]: queue "h/a" is not in consistency group "g"`, ErrInvalid},
		{"claim no queues", claim(&fsmpb.Claim{Claimant: "w", Lease: 1, Limit: 1}), "queues: name at least one queue", ErrInvalid},
		{"claim no claimant", claim(&fsmpb.Claim{Queues: []string{"g"}, Lease: 1, Limit: 1}), "claimant: required", ErrInvalid},
		{"lease zero", claim(&fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Limit: 1}), "lease: 0s is outside (0s, 24h0m0s]", ErrInvalid},
		{"lease negative", claim(&fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Lease: -5e9, Limit: 1}), "lease: -5s is outside (0s, 24h0m0s]", ErrInvalid},
		{"lease long", claim(&fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Lease: 86400000000001, Limit: 1}),
			"lease: 24h0m0.000000001s is outside (0s, 24h0m0s]", ErrInvalid},
		{"limit zero", claim(&fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Lease: 1}), "limit: 0 is outside [1, 1000]", ErrInvalid},
		{"limit big", claim(&fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Lease: 1, Limit: 1001}), "limit: 1001 is outside [1, 1000]", ErrInvalid},
		{"purge", &fsmpb.Command{Op: fsmpb.Op_OP_PURGE, Purge: &fsmpb.Purge{Queue: "g/q"}}, "", nil},
		{"purge no queue", &fsmpb.Command{Op: fsmpb.Op_OP_PURGE, Purge: &fsmpb.Purge{}}, "purge.queue: required", ErrInvalid},
		{"tick", &fsmpb.Command{Op: fsmpb.Op_OP_TICK}, "", nil},
		{"unknown op", &fsmpb.Command{Op: 42}, "op: unknown op 42", ErrInvalid},
		{"body mismatch", &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Claim: okClaim()}, "claim: must be empty for OP_TICK", ErrInvalid},
		{"missing body", &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM}, "claim: required for OP_CLAIM", ErrInvalid},
		{"long client id", &fsmpb.Command{Op: fsmpb.Op_OP_TICK, ClientId: strings.Repeat("c", 257)}, "client_id: 257 bytes exceeds the limit of 256", ErrInvalid},
		{"batch", &fsmpb.Command{Op: fsmpb.Op_OP_BATCH, Batch: []*fsmpb.Command{{Op: fsmpb.Op_OP_TICK}, claim(okClaim())}}, "", nil},
		{"batch bad claim", &fsmpb.Command{Op: fsmpb.Op_OP_BATCH, Batch: []*fsmpb.Command{{Op: fsmpb.Op_OP_TICK},
			claim(&fsmpb.Claim{Claimant: "w", Queues: []string{"g"}, Lease: 1})}}, "batch[1].limit: 0 is outside [1, 1000]", ErrInvalid},
		{"nested batch", &fsmpb.Command{Op: fsmpb.Op_OP_BATCH, Batch: []*fsmpb.Command{{Op: fsmpb.Op_OP_BATCH, Batch: []*fsmpb.Command{{Op: fsmpb.Op_OP_TICK}}}}},
			"batch[0].op: a batch may not contain a batch", ErrInvalid},
		{"nil", nil, "command: required", ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.cmd, Limits{})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
			if !errors.Is(err, tt.kind) {
				t.Fatalf("%v does not wrap %v", err, tt.kind)
			}
		})
	}
	// Limits apply field by field.
	err := Validate(modify(&fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g", Value: make([]byte, 11)}}}), Limits{MaxValueBytes: 10})
	if err == nil || err.Error() != "inserts[0].value: 11 bytes exceeds the limit of 10" {
		t.Fatalf("custom limit: %v", err)
	}
}

func persist(t testing.TB, m *Machine) []byte {
	t.Helper()
	snap, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := snap.(*snapshot).writeTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sampleMachine(t testing.TB) *Machine {
	m := newMachine(t, Options{})
	m.ApplyCommand(1, insertCmd(10, "a", "b", "c"))
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 20, ClientId: "x", Seq: 3,
		Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 2}})
	return m
}

// TestRestoreRejectsDamage cuts and flips the stream everywhere: every
// damaged stream is an error and leaves the machine as it was.
func TestRestoreRejectsDamage(t *testing.T) {
	data := persist(t, sampleMachine(t))
	m := newMachine(t, Options{})
	m.ApplyCommand(1, insertCmd(5, "keep"))
	before := m.Digest()
	restore := func(b []byte) error { return m.Restore(io.NopCloser(bytes.NewReader(b))) }
	for n := 0; n < len(data); n++ {
		if err := restore(data[:n]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", n, len(data))
		}
	}
	for i := range data {
		for _, bit := range []byte{0x01, 0x80} {
			b := bytes.Clone(data)
			b[i] ^= bit
			if err := restore(b); err == nil {
				t.Fatalf("bit %#x flipped at byte %d: no error", bit, i)
			}
		}
	}
	if err := restore(append(bytes.Clone(data), 0)); err == nil {
		t.Fatal("trailing byte: no error")
	}
	if m.Digest() != before {
		t.Fatal("a failed restore changed the machine")
	}
	if err := restore(data); err != nil {
		t.Fatal(err)
	}
	if m.Digest() != sampleMachine(t).Digest() || m.AppliedIndex() != 2 {
		t.Fatal("restored state differs")
	}
}

func TestRestoreChecksContent(t *testing.T) {
	// Well-framed streams with a valid checksum but impossible content.
	build := func(recs ...*fsmpb.SnapshotRecord) []byte {
		var buf bytes.Buffer
		sw := &snapshotWriter{w: bufioWriter(&buf)}
		sw.write([]byte(snapshotMagic))
		for _, r := range recs {
			if err := sw.record(r); err != nil {
				t.Fatal(err)
			}
		}
		sw.record(&fsmpb.SnapshotRecord{Trailer: &fsmpb.SnapshotTrailer{Crc32C: sw.crc}})
		sw.w.Flush()
		return buf.Bytes()
	}
	hdr := func(tasks, sessions uint64) *fsmpb.SnapshotRecord {
		return &fsmpb.SnapshotRecord{Header: &fsmpb.SnapshotHeader{Format: 1, Tasks: tasks, Sessions: sessions}}
	}
	task := func(id, queue, key string) *fsmpb.SnapshotRecord {
		return &fsmpb.SnapshotRecord{Task: &fsmpb.Task{Id: id, Queue: queue, Key: key, Version: 1}}
	}
	tests := map[string][]byte{
		"count short":   build(hdr(2, 0), task("a", "q", "")),
		"count long":    build(hdr(0, 0), task("a", "q", "")),
		"duplicate id":  build(hdr(2, 0), task("a", "q", ""), task("a", "q", "")),
		"duplicate key": build(hdr(2, 0), task("a", "q", "k"), task("b", "q", "k")),
		"empty queue":   build(hdr(1, 0), task("a", "", "")),
		"no header":     build(task("a", "q", "")),
		"bad format":    build(&fsmpb.SnapshotRecord{Header: &fsmpb.SnapshotHeader{Format: 2}}),
		"two bodies":    build(hdr(1, 0), &fsmpb.SnapshotRecord{Task: &fsmpb.Task{Id: "a", Queue: "q"}, Session: &fsmpb.Session{ClientId: "c"}}),
		"session nil":   build(hdr(0, 1), &fsmpb.SnapshotRecord{Session: &fsmpb.Session{ClientId: "c"}}),
	}
	if err := newMachine(t, Options{}).Restore(io.NopCloser(bytes.NewReader(build(hdr(2, 0), task("a", "q", "k"), task("b", "q", ""))))); err != nil {
		t.Fatalf("valid stream: %v", err)
	}
	for name, data := range tests {
		err := newMachine(t, Options{}).Restore(io.NopCloser(bytes.NewReader(data)))
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	// A huge length prefix is refused without allocating it.
	data := append([]byte(snapshotMagic), 0xff, 0xff, 0xff, 0xff, 0x0f)
	if err := newMachine(t, Options{}).Restore(io.NopCloser(bytes.NewReader(data))); !errors.Is(err, ErrCorruptSnapshot) {
		t.Errorf("huge length: %v", err)
	}
}

// TestSnapshotIsConsistent: Apply goes on after Snapshot; the snapshot
// still holds the state at the time it was taken.
func TestSnapshotIsConsistent(t *testing.T) {
	m := sampleMachine(t)
	want := m.Digest()
	snap, _ := m.Snapshot()
	m.ApplyCommand(3, insertCmd(30, "d"))
	m.ApplyCommand(4, &fsmpb.Command{Op: fsmpb.Op_OP_PURGE, Now: 31, Purge: &fsmpb.Purge{Queue: "g/q"}})
	var buf bytes.Buffer
	if err := snap.(*snapshot).writeTo(&buf); err != nil {
		t.Fatal(err)
	}
	m2 := newMachine(t, Options{})
	if err := m2.Restore(io.NopCloser(&buf)); err != nil {
		t.Fatal(err)
	}
	if m2.Digest() != want || m2.TaskCount() != 3 {
		t.Fatalf("snapshot saw later changes: %d tasks", m2.TaskCount())
	}
}

func TestListPageToken(t *testing.T) {
	m := sampleMachine(t)
	if _, _, err := m.List("g/q", "!!!", 1, nil, false); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad token: %v", err)
	}
	tasks, next, err := m.List("g/q", "", 1, nil, true)
	if err != nil || len(tasks) != 1 || tasks[0].Id != "c" || tasks[0].Value != nil || next == "" {
		t.Fatalf("first page: %v %q %v", tasks, next, err)
	}
	// The token still works after its task changed.
	m.ApplyCommand(3, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 30, Modify: &fsmpb.Modify{Group: "g", Deletes: []*fsmpb.Ref{{Id: "c", Version: 1}}}})
	tasks, next, err = m.List("g/q", next, 5, nil, false)
	if err != nil || len(tasks) != 2 || tasks[0].Id != "a" || tasks[1].Id != "b" || next != "" {
		t.Fatalf("second page: %v %q %v", tasks, next, err)
	}
}

func bufioWriter(w io.Writer) *bufio.Writer { return bufio.NewWriter(w) }

func TestTaskCodecMatchesProto(t *testing.T) {
	q := &queue{name: "g/q"}
	tasks := []*task{
		{id: "a", q: q},
		{id: "b", q: q, key: "k", claimant: "w", err: "e", value: []byte{0, 1, 2}, version: 9, at: -5,
			created: 1 << 62, modified: 3, priority: -7, claims: 1 << 31, attempt: 4},
		{id: "c", q: q, key: "k", ext: newTaskExt(5, map[string]string{"traceparent": "00-ab-cd-01", "b": "2", "a": "1"})},
		{id: "d", q: q, ext: newTaskExt(0, map[string]string{"x": "y"})},
	}
	for _, tk := range tasks {
		rec := &fsmpb.SnapshotRecord{Task: tk.toProto(false)}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		sw := &snapshotWriter{w: bufioWriter(io.Discard)}
		sw.task(tk)
		// sw.buf holds the record without its length prefix.
		if !bytes.Equal(sw.buf, want) {
			t.Fatalf("task %s: hand encoding %x, proto %x", tk.id, sw.buf, want)
		}
		r, err := parseRecord(want)
		if err != nil {
			t.Fatal(err)
		}
		got, queue, err := decodeTask(r.task)
		if err != nil || string(queue) != "g/q" {
			t.Fatal(err)
		}
		got.q = q
		if !proto.Equal(got.toProto(false), rec.Task) {
			t.Fatalf("decoded %v, want %v", got.toProto(false), rec.Task)
		}
	}
}

// TestConcurrentReads runs reads and a snapshot's Persist against Apply;
// the race detector checks the locking and the immutability of tasks.
func TestConcurrentReads(t *testing.T) {
	m := newMachine(t, Options{})
	done := make(chan struct{})
	errc := make(chan error, 4)
	for range 3 {
		go func() {
			for {
				select {
				case <-done:
					errc <- nil
					return
				default:
				}
				m.Get([]string{"t1", "t2"})
				if _, _, err := m.List("g/q", "", 10, nil, false); err != nil {
					errc <- err
					return
				}
				m.Queues("g", 0)
				m.NextAt([]string{"g/q"})
				m.Clock()
			}
		}()
	}
	var snaps []raft.FSMSnapshot
	for i := range 300 {
		now := int64(10 + i)
		m.ApplyCommand(uint64(3*i+1), insertCmd(now, fmt.Sprintf("t%d", i)))
		m.ApplyCommand(uint64(3*i+2), &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: now,
			Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 5, Limit: 2}})
		if i%100 == 0 {
			s, _ := m.Snapshot()
			snaps = append(snaps, s)
			go func() { errc <- s.(*snapshot).writeTo(io.Discard) }()
		}
	}
	close(done)
	for range 3 + len(snaps) {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestManyPriorities covers the reads that walk priority runs (queue stats,
// NextAt) when a queue has more priorities than they look at: stats see the
// highest maxRuns, and NextAt answers no later than nextAtUnseen ahead, so a
// waiting claim looks again rather than sleeping past a lease it did not see.
func TestManyPriorities(t *testing.T) {
	m := newMachine(t, Options{})
	n := maxRuns + 44
	mod := &fsmpb.Modify{Group: "g"}
	for i := range n {
		// Priority i, inserted at i: the lowest priority is the oldest.
		mod.Inserts = append(mod.Inserts, &fsmpb.Insert{Id: fmt.Sprintf("t%03d", i), Queue: "g/q", Priority: int32(i), At: int64(1000 + i)})
	}
	if res := m.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: mod}); res.Failure != nil {
		t.Fatal(res.Failure)
	}
	// Everything is delayed (at 1000..1299, clock 10): NextAt sees only the
	// highest priorities (at >= 1044), so it answers 10 + nextAtUnseen.
	if at, ok := m.NextAt([]string{"g/q"}); !ok || at != min(int64(1000+n-maxRuns), 10+nextAtUnseen) {
		t.Fatalf("NextAt = %d, %v; want %d", at, ok, min(int64(1000+n-maxRuns), 10+nextAtUnseen))
	}
	// At 5000 all are available; the oldest the stats see is the lowest
	// of the maxRuns highest priorities.
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: 5000})
	st := m.Queues("g/", 0)
	if len(st) != 1 || st[0].Total != uint64(n) || st[0].Available != uint64(n) {
		t.Fatalf("stats %+v", st)
	}
	if want := int64(1000 + n - maxRuns); st[0].OldestAvailableAt != want {
		t.Fatalf("oldest available at %d, want %d", st[0].OldestAvailableAt, want)
	}
	// With few priorities both are exact.
	m2 := newMachine(t, Options{})
	m2.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{
		{Id: "hi", Queue: "g/q", Priority: 5, At: 300}, {Id: "lo", Queue: "g/q", Priority: 1, At: 200}}}})
	if at, ok := m2.NextAt([]string{"g/q"}); !ok || at != 200 {
		t.Fatalf("NextAt = %d, %v; want 200", at, ok)
	}
	m2.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: 250})
	if st := m2.Queues("g/", 0); st[0].OldestAvailableAt != 200 || st[0].Available != 1 || st[0].Delayed != 1 {
		t.Fatalf("stats %+v", st[0])
	}
}

// TestAvailable counts what a claim at a given time would find: due tasks,
// tasks whose delay or lease has run out by then (even when the machine's
// clock has not reached it), never more than limit.
func TestAvailable(t *testing.T) {
	m := newMachine(t, Options{})
	m.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{
		{Id: "a", Queue: "g/q"}, {Id: "b", Queue: "g/q", Priority: 3}, {Id: "later", Queue: "g/q", At: 100},
		{Id: "low", Queue: "g/q", Priority: -1, At: 50}}}})
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 20,
		Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 60, Limit: 1}}) // b, until 80
	for _, c := range []struct {
		now   int64
		limit int
		want  int
	}{
		{0, 10, 1}, {20, 10, 1}, {50, 10, 2}, {80, 10, 3}, {100, 10, 4}, {100, 2, 2}, {100, 0, 0},
	} {
		if got := m.Available("g/q", c.now, c.limit); got != c.want {
			t.Errorf("Available(g/q, %d, %d) = %d, want %d", c.now, c.limit, got, c.want)
		}
	}
	if got := m.Available("g/none", 100, 10); got != 0 {
		t.Errorf("Available of a missing queue = %d", got)
	}
}

// memMachine and diskMachine make an empty machine on each store.
func memMachine(_ testing.TB, opts Options) *Machine { return New(opts) }

func diskMachine(t testing.TB, opts Options) *Machine {
	t.Helper()
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	m, err := NewOnDisk(opts, db, 7)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// quietLogger keeps Pebble's informational lines out of test output.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)              {}
func (quietLogger) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (quietLogger) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

var onDisk = flag.Bool("fsm.ondisk", false, "run the machine tests on the on-disk store (fsm/ondisk) instead of the in-memory one")

// newMachine is an empty machine on the store the tests run on
// (-fsm.ondisk). Tests that name a store use memMachine or diskMachine.
func newMachine(t testing.TB, opts Options) *Machine {
	if *onDisk {
		return diskMachine(t, opts)
	}
	return New(opts)
}

// TestQueueCountsReadTheOldestOnlyWhereAsked: QueueCounts gives the counts
// Queues gives, and the oldest available task only for the queues the
// caller asks about, asking once per queue: a metrics scrape of 100,000
// queues on disk read every queue's first task (seconds of CPU) to report
// 500 series.
func TestQueueCountsReadTheOldestOnlyWhereAsked(t *testing.T) {
	m := newMachine(t, Options{})
	mod := &fsmpb.Modify{Group: "g"}
	for i, q := range []string{"g/a", "g/b", "g/c"} {
		mod.Inserts = append(mod.Inserts, &fsmpb.Insert{Id: "t" + q, Queue: q, At: int64(100 + i)},
			&fsmpb.Insert{Id: "u" + q, Queue: q, At: 5000})
	}
	if res := m.ApplyCommand(1, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: mod}); res.Failure != nil {
		t.Fatal(res.Failure)
	}
	m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_TICK, Now: 1000})
	full := map[string]QueueStats{}
	for _, st := range m.Queues("", 0) {
		full[st.Name] = st
	}
	asked := map[string]int{}
	var got []QueueStats
	m.QueueCounts(func(name string) bool {
		asked[name]++
		return name != "g/b"
	}, func(st QueueStats) { got = append(got, st) })
	if len(got) != 3 {
		t.Fatalf("QueueCounts gave %+v, want 3 queues", got)
	}
	for _, st := range got {
		want := full[st.Name]
		if asked[st.Name] != 1 {
			t.Errorf("%s: asked %d times about its oldest, want once", st.Name, asked[st.Name])
		}
		if st.Name == "g/b" {
			want.OldestAvailableAt = 0
		} else if st.OldestAvailableAt == 0 {
			t.Errorf("%s: no oldest available task, Queues has %d", st.Name, want.OldestAvailableAt)
		}
		if st != want {
			t.Errorf("QueueCounts %+v, want %+v", st, want)
		}
	}
}
