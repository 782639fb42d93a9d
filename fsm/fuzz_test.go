package fsm

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// seedCommands are valid commands of every op, used to seed the fuzzers.
func seedCommands() []*fsmpb.Command {
	pri := int32(3)
	return []*fsmpb.Command{
		insertCmd(10, "a", "b"),
		{Op: fsmpb.Op_OP_MODIFY, Now: 11, ClientId: "c", Seq: 2, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
			Inserts: []*fsmpb.Insert{{Id: "k", Queue: "g/q", Key: "key", IfAbsent: true, At: 50}},
			Changes: []*fsmpb.Change{{Id: "a", Version: 1, Queue: "g/r", Priority: &pri, Value: []byte("x"), KeepClaim: true}},
			Deletes: []*fsmpb.Ref{{Id: "b", Version: 1}}, Depends: []*fsmpb.Ref{{Id: "a", Version: 1}}}},
		{Op: fsmpb.Op_OP_CLAIM, Now: 12, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q", "g/r"}, Lease: 1e9, Limit: 3}},
		{Op: fsmpb.Op_OP_PURGE, Now: 13, Purge: &fsmpb.Purge{Queue: "g/q"}},
		{Op: fsmpb.Op_OP_TICK, Now: 14},
		{Op: fsmpb.Op_OP_BATCH, Now: 15, Batch: []*fsmpb.Command{{Op: fsmpb.Op_OP_TICK}, insertCmd(16, "z")}},
		{Op: fsmpb.Op_OP_MODIFY_CLAIM, Now: 17, ClientId: "c", Seq: 3, Modify: &fsmpb.Modify{Group: "g", Claimant: "w",
			Deletes: []*fsmpb.Ref{{Id: "z", Version: 1}},
			Claim:   &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q", "g/r"}, Lease: 1e9, Limit: 2}}},
	}
}

// FuzzDecodeCommand: decoding never panics, a decoded command re-encodes
// and decodes to the same command, and applying it or validating it never
// panics either.
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range seedCommands() {
		b, err := EncodeCommand(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x63})
	f.Fuzz(func(t *testing.T, data []byte) {
		cmd, err := DecodeCommand(data)
		if err != nil {
			return
		}
		b, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeCommand(b)
		if err != nil || !proto.Equal(cmd, again) {
			t.Fatalf("round trip: %v, %v", again, err)
		}
		_ = Validate(cmd, Limits{})
		m := sampleMachine(t)
		m.ApplyCommand(3, cmd)
		m.Digest()
	})
}

// FuzzValidate: Validate never panics, and what it accepts applies without
// a shape failure.
func FuzzValidate(f *testing.F) {
	for _, c := range seedCommands() {
		b, _ := proto.Marshal(c)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cmd := &fsmpb.Command{}
		if proto.Unmarshal(data, cmd) != nil {
			return
		}
		err := Validate(cmd, Limits{})
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v is neither ErrInvalid nor ErrTooLarge", err)
			}
			return
		}
		res := newMachine(t, Options{}).ApplyCommand(1, cmd)
		if msg := res.GetFailure().GetMessage(); msg != "" {
			t.Fatalf("valid command failed with %q", msg)
		}
		for _, sub := range res.GetBatch() {
			if msg := sub.GetFailure().GetMessage(); msg != "" {
				t.Fatalf("valid batch command failed with %q", msg)
			}
		}
	})
}

// FuzzRestore: Restore never panics; garbage is an error and leaves the
// machine as it was; what it accepts snapshots back to an equal state.
func FuzzRestore(f *testing.F) {
	f.Add(persist(f, sampleMachine(f)))
	f.Add(persist(f, newMachine(f, Options{})))
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := newMachine(t, Options{})
		m.ApplyCommand(1, insertCmd(5, "keep"))
		before := m.Digest()
		if err := m.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			if m.Digest() != before {
				t.Fatal("failed restore changed the machine")
			}
			return
		}
		m2 := newMachine(t, Options{})
		if err := m2.Restore(io.NopCloser(bytes.NewReader(persist(t, m)))); err != nil {
			t.Fatalf("re-snapshot of an accepted stream: %v", err)
		}
		if m.Digest() != m2.Digest() {
			t.Fatal("digest changed through a snapshot")
		}
	})
}
