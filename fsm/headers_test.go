package fsm

import (
	"bytes"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestHeaders: from FormatHeaders a task keeps its insert's headers through
// changes that do not name them and moves to another queue; a change's
// headers replace them, clear_headers removes them; a listing filters by
// them; they survive a snapshot into either store, and both stores agree
// (Digest). Below the format they are ignored.
func TestHeaders(t *testing.T) {
	stores := map[string]func(testing.TB, Options) *Machine{
		"memory": func(testing.TB, Options) *Machine { return New(Options{}) },
		"disk":   diskMachine,
	}
	digests := map[string][32]byte{}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			m := open(t, Options{})
			mod := func(now int64, md *fsmpb.Modify) *fsmpb.Result {
				md.Group = "g"
				res := m.ApplyCommand(uint64(now), &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Now: now, Modify: md})
				if res.Failure != nil {
					t.Fatalf("at %d: %v", now, res.Failure)
				}
				return res
			}
			trace := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
			m.ApplyCommand(1, SetFormatCommand(FormatMemoryBudget))
			if got := mod(2, &fsmpb.Modify{Inserts: []*fsmpb.Insert{{Id: "old", Queue: "g/q", Headers: trace}}}).GetModify().GetInserted()[0]; got.Headers != nil {
				t.Fatalf("format %d kept headers %v", FormatMemoryBudget, got.Headers)
			}
			m.ApplyCommand(3, SetFormatCommand(FormatHeaders))
			ins := mod(4, &fsmpb.Modify{Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g/q", Headers: trace}, {Id: "b", Queue: "g/q", Headers: map[string]string{"tenant": "other"}}}})
			if got := ins.GetModify().GetInserted()[0].Headers; !maps.Equal(got, trace) {
				t.Fatalf("inserted headers %v, want %v", got, trace)
			}
			// A claim, a change of another field and a move keep them.
			m.ApplyCommand(5, &fsmpb.Command{Op: fsmpb.Op_OP_CLAIM, Now: 5, Claim: &fsmpb.Claim{Claimant: "w", Queues: []string{"g/q"}, Lease: 100, Limit: 3}})
			a := m.Get([]string{"a"})[0]
			if !maps.Equal(a.Headers, trace) || a.Claimant != "w" {
				t.Fatalf("claimed %v, want headers kept", a)
			}
			moved := mod(6, &fsmpb.Modify{Claimant: "w", Changes: []*fsmpb.Change{{Id: "a", Version: a.Version, Queue: "g/dead", Err: ptr("boom")}}})
			if got := moved.GetModify().GetChanged()[0]; !maps.Equal(got.Headers, trace) || got.Queue != "g/dead" {
				t.Fatalf("moved %v, want headers kept", got)
			}
			f := func(queue string, h map[string]string) []string {
				tasks, _, err := m.ListFiltered(queue, "", 100, ListFilter{Headers: h}, true, 0)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, tk := range tasks {
					ids = append(ids, tk.Id)
				}
				return ids
			}
			if got := f("g/dead", map[string]string{"tenant": "acme"}); len(got) != 1 || got[0] != "a" {
				t.Fatalf("filter tenant=acme in g/dead: %v", got)
			}
			if got := f("g/q", map[string]string{"tenant": "acme"}); len(got) != 0 {
				t.Fatalf("filter tenant=acme in g/q: %v, want none", got)
			}
			if got := f("g/q", map[string]string{"tenant": "other"}); len(got) != 1 || got[0] != "b" {
				t.Fatalf("filter tenant=other in g/q: %v", got)
			}
			// Replace, then clear.
			b := m.Get([]string{"b"})[0]
			repl := mod(7, &fsmpb.Modify{Claimant: "w", Changes: []*fsmpb.Change{{Id: "b", Version: b.Version, Headers: map[string]string{"x": "1"}}}})
			if got := repl.GetModify().GetChanged()[0].Headers; !maps.Equal(got, map[string]string{"x": "1"}) {
				t.Fatalf("replaced headers %v", got)
			}
			cl := mod(8, &fsmpb.Modify{Claimant: "w", Changes: []*fsmpb.Change{{Id: "b", Version: b.Version + 1, ClearHeaders: true}}})
			if got := cl.GetModify().GetChanged()[0].Headers; len(got) != 0 {
				t.Fatalf("cleared headers %v", got)
			}
			mod(9, &fsmpb.Modify{Inserts: []*fsmpb.Insert{{Id: "c", Queue: "g/q", Key: "k", DedupWindow: 50, Headers: map[string]string{"k": "v"}}}})

			// A snapshot restores into either store with the headers.
			stream := persisted(t, m)
			for to, open := range stores {
				r := open(t, Options{})
				if err := r.Restore(io.NopCloser(bytes.NewReader(stream))); err != nil {
					t.Fatal(err)
				}
				if got := r.Get([]string{"a"})[0]; !maps.Equal(got.Headers, trace) {
					t.Fatalf("restored into %s: a's headers %v", to, got.Headers)
				}
				if got := r.Get([]string{"c"})[0]; !maps.Equal(got.Headers, map[string]string{"k": "v"}) || got.DedupWindow != 50 {
					t.Fatalf("restored into %s: c is %v", to, got)
				}
				if r.Digest() != m.Digest() {
					t.Fatalf("restored into %s: digest differs", to)
				}
			}
			digests[name] = m.Digest()
		})
	}
	if digests["memory"] != digests["disk"] {
		t.Fatal("the stores' digests differ")
	}
}

// TestValidateHeaders: the bounds of a task's headers, each refused with a
// message naming the field.
func TestValidateHeaders(t *testing.T) {
	many := map[string]string{}
	for i := range MaxHeaders + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	big := map[string]string{"a": strings.Repeat("v", MaxHeaderBytes)}
	for name, tc := range map[string]struct {
		h    map[string]string
		want string
	}{
		"ok":        {map[string]string{"traceparent": "00-ab-cd-01"}, ""},
		"too many":  {many, "33 headers exceed the limit of 32"},
		"too big":   {big, "over the limit of 4096"},
		"long key":  {map[string]string{strings.Repeat("k", MaxHeaderKeyBytes+1): "v"}, "exceeds the limit of 256"},
		"empty key": {map[string]string{"": "v"}, "must not be empty"},
		"empty val": {map[string]string{"k": ""}, "empty value"},
		"not utf-8": {map[string]string{"k": "\xff"}, "not valid UTF-8"},
	} {
		cmd := &fsmpb.Command{Op: fsmpb.Op_OP_MODIFY, Modify: &fsmpb.Modify{Group: "g",
			Inserts: []*fsmpb.Insert{{Id: "a", Queue: "g/q", Headers: tc.h}}}}
		err := Validate(cmd, Limits{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "inserts[0].headers")):
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
