package taskstorepb

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestCompactThenExpandInserted: a task repeated by coalesced inserts goes
// out in full once and comes back whole; distinct tasks are untouched.
func TestCompactThenExpandInserted(t *testing.T) {
	big := bytes.Repeat([]byte("v"), 1<<20)
	held := &Task{Id: "a", Version: 3, Queue: "g/q", Value: big}
	r := &ModifyResponse{Coalesced: []uint32{0, 2, 3}, Inserted: []*Task{held, {Id: "b", Version: 1, Value: []byte("own")}, held, held}}
	CompactInserted(r)
	if n := proto.Size(r); n > len(big)+1024 {
		t.Fatalf("compacted answer is %d bytes", n)
	}
	if len(held.Value) != len(big) || len(r.Inserted[1].Value) != 3 || len(r.SameAs) != 2 || r.SameAs[2] != 0 || r.SameAs[3] != 0 {
		t.Fatalf("compacted: %v (the caller's task lost its value: %v)", r.SameAs, len(held.Value) != len(big))
	}
	wire, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	got := &ModifyResponse{}
	if err := proto.Unmarshal(wire, got); err != nil {
		t.Fatal(err)
	}
	ExpandInserted(got)
	for i, tk := range got.Inserted {
		if want := []*Task{held, nil, held, held}[i]; want != nil && (tk.Id != "a" || !bytes.Equal(tk.Value, big)) {
			t.Fatalf("entry %d after expand: %s, %d bytes", i, tk.Id, len(tk.Value))
		}
	}
	if got.SameAs != nil {
		t.Fatal("same_as left after expand")
	}
	ExpandInserted(nil) // a failed call's nil answer
}
