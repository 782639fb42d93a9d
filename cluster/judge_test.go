package cluster

import (
	"slices"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/cluster/peerpb"
)

func cps(pairs ...any) []*peerpb.Checkpoint {
	var out []*peerpb.Checkpoint
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, &peerpb.Checkpoint{Index: uint64(pairs[i].(int)), Digest: []byte(pairs[i+1].(string))})
	}
	return out
}

// judge decides on the newest checkpoint that self and a majority of the
// voters have, and only ever about self.
func TestJudge(t *testing.T) {
	three := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name     string
		voters   []string
		seen     map[string][]*peerpb.Checkpoint
		index    uint64
		diverged bool
		agree    []string
		disagree bool
	}{
		{name: "all agree", voters: three, index: 20,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(10, "x", 20, "y"), "b": cps(10, "x", 20, "y"), "c": cps(10, "x", 20, "y")}, agree: three},
		{name: "self differs from two", voters: three, index: 20, diverged: true, agree: []string{"b", "c"},
			seen: map[string][]*peerpb.Checkpoint{"a": cps(10, "x", 20, "BAD"), "b": cps(10, "x", 20, "y"), "c": cps(10, "x", 20, "y")}},
		{name: "another differs: not self's business", voters: three, index: 20, agree: []string{"a", "b"},
			seen: map[string][]*peerpb.Checkpoint{"a": cps(20, "y"), "b": cps(20, "y"), "c": cps(20, "BAD")}},
		{name: "two reporting voters disagree", voters: three, index: 20, disagree: true,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(20, "y"), "b": cps(20, "z")}},
		{name: "two-voter group disagrees", voters: []string{"a", "b"}, index: 20, disagree: true,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(20, "y"), "b": cps(20, "z")}},
		{name: "only self has the newest: judge an older one", voters: three, index: 10, agree: three,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(10, "x", 20, "y"), "b": cps(10, "x"), "c": cps(10, "x")}},
		{name: "no peer reported", voters: three, index: 0,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(10, "x")}},
		{name: "self has no checkpoint there (restored from a snapshot)", voters: three, index: 0,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(30, "x"), "b": cps(10, "x"), "c": cps(10, "x")}},
		{name: "five voters, two-two-one", voters: []string{"a", "b", "c", "d", "e"}, index: 5, disagree: true,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(5, "x"), "b": cps(5, "x"), "c": cps(5, "y"), "d": cps(5, "y"), "e": cps(5, "z")}},
		{name: "five voters, self in a minority of two", voters: []string{"a", "b", "c", "d", "e"}, index: 5, diverged: true, agree: []string{"c", "d", "e"},
			seen: map[string][]*peerpb.Checkpoint{"a": cps(5, "x"), "b": cps(5, "x"), "c": cps(5, "y"), "d": cps(5, "y"), "e": cps(5, "y")}},
		{name: "non-voters are not counted", voters: three, index: 0,
			seen: map[string][]*peerpb.Checkpoint{"a": cps(5, "x"), "z": cps(5, "x")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge("a", tc.voters, tc.seen)
			if v.index != tc.index || v.diverged != tc.diverged || (v.disagree != "") != tc.disagree {
				t.Fatalf("verdict %+v, want index %d diverged %v disagree %v", v, tc.index, tc.diverged, tc.disagree)
			}
			if tc.agree != nil && !slices.Equal(v.agree, tc.agree) {
				t.Fatalf("majority %v, want %v", v.agree, tc.agree)
			}
			if tc.disagree && !strings.Contains(v.disagree, "a=") {
				t.Fatalf("disagreement does not name the replicas: %s", v.disagree)
			}
		})
	}
}
