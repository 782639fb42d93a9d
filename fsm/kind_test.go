package fsm

import (
	"encoding/hex"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Answers as binaries without failure kinds stored them (recorded from
// one: proto encodings of the stored Result).
const (
	// The replayed answer to a Modify refused for its scope.
	oldOutOfScope = "223712356f7574206f662073636f70653a207461736b20226122206973206e6f7420696e206120717565756520756e64657220672f64656d6f"
	oldMemoryFull = "22b70112b4016d656d6f72792062756467657420726561636865643a207468652073686172642773207461736b732074616b6520312e30204d6942206f662074686520312e30204d69422074686973207368617264206d617920686f6c6420696e206d656d6f72792c20616e6420746869732072657175657374206e656564732031302042206d6f72653b20636c61696d206f722064656c657465207461736b732c206f72207261697365202d2d6d656d6f72792d6c696d6974"
	oldTooLarge   = "22771275616e7377657220746f6f206c617267653a2074686520696e73657274656420616e64206368616e676564207461736b732074616b652061626f757420353030302062797465732c206f76657220746865206c696d6974206f6620343039363b2073706c697420746865207472616e73616374696f6e"
	oldSlotFormat = "2231122f4f505f534c4f54206e6565647320737461746520666f726d617420333b207468652073686172642069732061742032"
)

func decodeOld(t *testing.T, h string) *fsmpb.Result {
	t.Helper()
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	r := &fsmpb.Result{}
	if err := proto.Unmarshal(b, r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestKindOfOldAnswers: answers recorded without a kind decode and are
// classified as the kind their failure is now, so they map to the codes
// they mapped to.
func TestKindOfOldAnswers(t *testing.T) {
	for _, c := range []struct {
		name string
		f    *fsmpb.Failure
		want fsmpb.Failure_Kind
	}{
		{"out of scope", decodeOld(t, oldOutOfScope).Failure, fsmpb.Failure_OUT_OF_SCOPE},
		{"memory full", decodeOld(t, oldMemoryFull).Failure, fsmpb.Failure_MEMORY_FULL},
		{"answer too large", decodeOld(t, oldTooLarge).Failure, fsmpb.Failure_ANSWER_TOO_LARGE},
		{"slot needs format", decodeOld(t, oldSlotFormat).Failure, fsmpb.Failure_SLOT_NEEDS_FORMAT},
		{"references", &fsmpb.Failure{Errors: []*fsmpb.RefError{{Category: fsmpb.RefError_CHANGE_STALE, Id: "a"}}}, fsmpb.Failure_REFERENCES},
		{"moved", &fsmpb.Failure{Message: "slot moved", Moved: &fsmpb.SlotState{}}, fsmpb.Failure_MOVED},
		{"stale", &fsmpb.Failure{Message: "stale request sequence"}, fsmpb.Failure_STALE_SEQUENCE},
		{"schedule", &fsmpb.Failure{Message: `schedule of another queue: schedule "s" belongs to queue "g/b"; name that queue (or remove it first)`}, fsmpb.Failure_SCHEDULE_ELSEWHERE},
		{"slot refused", &fsmpb.Failure{Message: "OP_SLOT FREEZE of slot 3 (move 1): the slot is FROZEN, want SERVING"}, fsmpb.Failure_SLOT_REFUSED},
		{"invalid", &fsmpb.Failure{Message: "modify.group: required"}, fsmpb.Failure_INVALID},
		// A kind, when there is one, wins over the message.
		{"kind set", &fsmpb.Failure{Kind: fsmpb.Failure_INVALID, Message: "memory budget reached, says the message"}, fsmpb.Failure_INVALID},
	} {
		if got := KindOf(c.f); got != c.want {
			t.Errorf("%s: KindOf = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestFailureKinds: every kind the machine decides, on the answer itself;
// and the answer as a binary without kinds would store it classifies as
// the same kind (today's messages start as released binaries' did).
func TestFailureKinds(t *testing.T) {
	at := func(format uint32) *Machine {
		m := newMachine(t, Options{})
		m.ApplyCommand(1, SetFormatCommand(format))
		m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g",
			Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g/secret"}, {Id: "b", Queue: "g/q", Value: make([]byte, 100)}}}})
		m.ApplyCommand(3, &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Now: 11, Schedule: &fsmpb.Schedule{Name: "s", Queue: "g/a", Every: 1e9, Next: 2e9}})
		m.ApplyCommand(4, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 12, ClientId: "c", Seq: 5, Modify: &fsmpb.Modify{Group: "g"}})
		return m
	}
	for _, c := range []struct {
		name   string
		format uint32
		cmd    *fsmpb.Command
		want   fsmpb.Failure_Kind
	}{
		{"invalid", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{}}, fsmpb.Failure_INVALID},
		{"references", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "g", Deletes: []*fsmpb.Ref{{Id: "x", Version: 1}}}}, fsmpb.Failure_REFERENCES},
		{"stale sequence", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, ClientId: "c", Seq: 4, Modify: &fsmpb.Modify{Group: "g"}}, fsmpb.Failure_STALE_SEQUENCE},
		{"memory full", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Budget: &fsmpb.MemoryBudget{Bytes: 10},
			Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{{Id: "n", Queue: "g/q"}}}}, fsmpb.Failure_MEMORY_FULL},
		{"out of scope", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "g", Scope: []string{"g/demo"},
			Deletes: []*fsmpb.Ref{{Id: "a", Version: 1}}}}, fsmpb.Failure_OUT_OF_SCOPE},
		{"answer too large", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "g", MaxAnswerBytes: 10,
			Changes: []*fsmpb.Change{{Id: "b", Version: 1, Value: make([]byte, 100)}}}}, fsmpb.Failure_ANSWER_TOO_LARGE},
		{"schedule elsewhere", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_SCHEDULE, Schedule: &fsmpb.Schedule{Name: "s", Queue: "g/b", Every: 1e9, Next: 2e9}}, fsmpb.Failure_SCHEDULE_ELSEWHERE},
		{"slot needs format", FormatQueueControls, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, 1, 1)), fsmpb.Failure_SLOT_NEEDS_FORMAT},
		{"slot refused", MaxFormat, slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, testSlots+1, 1)), fsmpb.Failure_SLOT_REFUSED},
		{"moved", MaxFormat, &fsmpb.Command{Op: fsmpb.Op_OP_BATCH, Batch: []*fsmpb.Command{
			slotOp(slotCmd(fsmpb.SlotCommand_FREEZE, SlotOf("g", testSlots), 1)),
			{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "g", Deletes: []*fsmpb.Ref{{Id: "a", Version: 1}}}}}}, fsmpb.Failure_MOVED},
	} {
		m := at(c.format)
		c.cmd.Now = 20
		res := m.ApplyCommand(10, c.cmd)
		if len(res.Batch) > 0 {
			res = res.Batch[len(res.Batch)-1]
		}
		if got := res.GetFailure().GetKind(); got != c.want {
			t.Errorf("%s: kind %v (%v), want %v", c.name, got, res, c.want)
			continue
		}
		if got := KindOf(withoutKinds(res).Failure); got != c.want {
			t.Errorf("%s: stored without its kind, %q reads as %v", c.name, res.Failure.Message, got)
		}
	}
}

// TestStoredAnswerKindFromFormat: below FormatFailureKinds a session
// stores its answer byte for byte as a binary without kinds did (the
// recorded answer), so replicas of either binary keep the same state; the
// answer to the request carries its kind all the same. From the format on,
// the stored answer keeps it.
func TestStoredAnswerKindFromFormat(t *testing.T) {
	for _, format := range []uint32{FormatMemoryBudget, FormatFailureKinds} {
		m := newMachine(t, Options{})
		m.ApplyCommand(1, SetFormatCommand(format))
		m.ApplyCommand(2, &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 10, Modify: &fsmpb.Modify{Group: "g", Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g/secret"}}}})
		cmd := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: 11, ClientId: "c", Seq: 1, Modify: &fsmpb.Modify{Group: "g", Scope: []string{"g/demo"}, Deletes: []*fsmpb.Ref{{Id: "a", Version: 1}}}}
		if res := m.ApplyCommand(3, cmd); res.GetFailure().GetKind() != fsmpb.Failure_OUT_OF_SCOPE {
			t.Fatalf("format %d: answer %v, want kind OUT_OF_SCOPE", format, res)
		}
		replay := proto.Clone(m.ApplyCommand(4, cmd)).(*fsmpb.Result)
		if !replay.Replayed || KindOf(replay.Failure) != fsmpb.Failure_OUT_OF_SCOPE {
			t.Fatalf("format %d: replay %v", format, replay)
		}
		replay.Replayed = false
		if format < FormatFailureKinds {
			b, _ := proto.Marshal(replay)
			if got := hex.EncodeToString(b); got != oldOutOfScope {
				t.Errorf("format %d: stored answer %s, a binary without kinds stores %s", format, got, oldOutOfScope)
			}
		} else if replay.Failure.Kind != fsmpb.Failure_OUT_OF_SCOPE {
			t.Errorf("format %d: stored answer %v lost its kind", format, replay)
		}
	}
}
