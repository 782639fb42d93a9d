package control

import (
	"slices"
	"testing"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

func TestPreferredLeader(t *testing.T) {
	sh := &metapb.Shard{Id: 1, PreferredLeader: "b", Replicas: []string{"a", "b", "c"}}
	all := func(string) bool { return true }
	none := func(string) bool { return false }
	not := func(ids ...string) func(string) bool {
		return func(id string) bool { return !slices.Contains(ids, id) }
	}
	for _, tc := range []struct {
		name    string
		sh      *metapb.Shard
		voters  []string
		mayLead func(string) bool
		want    string
	}{
		{"the preferred leader first", sh, []string{"a", "b", "c"}, all, "b"},
		{"then the replicas in list order", sh, []string{"a", "b", "c"}, not("b"), "a"},
		{"skipping those that may not lead", sh, []string{"a", "b", "c"}, not("a", "b"), "c"},
		{"and those that are not voters", sh, []string{"c"}, all, "c"},
		{"none may lead", sh, []string{"a", "b", "c"}, none, ""},
		{"no voter", sh, nil, all, ""},
		{"no preferred leader recorded", &metapb.Shard{Id: 1, Replicas: []string{"c", "a"}}, []string{"a", "c"}, all, "c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PreferredLeader(tc.sh, tc.voters, tc.mayLead); got != tc.want {
				t.Errorf("PreferredLeader = %q, want %q", got, tc.want)
			}
		})
	}
}
