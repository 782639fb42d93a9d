package control

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestNextConfigChange: given the map's replicas and a group's
// configuration, the shard leader's next change.
func TestNextConfigChange(t *testing.T) {
	names := map[ConfigKind]string{ConfigNone: "none", ConfigRemoveDead: "remove dead", ConfigAddNonvoter: "add non-voter",
		ConfigPromote: "promote", ConfigHandOff: "hand off to", ConfigRemove: "remove"}
	// servers: "n1" a voter, "n2?" a non-voter.
	for _, tc := range []struct {
		name     string
		replicas string // ">" then the preferred leader
		servers  string
		dead     []string
		want     string
	}{
		{"as wanted", "n1,n2,n3>n1", "n1 n2 n3", nil, "none"},
		// A dead surplus voter goes before anything is added.
		{"dead surplus first", "n1,n2,n4>n1", "n1 n2 n3", []string{"n3"}, "remove dead n3"},
		{"add a new replica", "n1,n2,n4>n1", "n1 n2 n3", nil, "add non-voter n4 n4:1"},
		{"no address for a new replica", "n1,n2,n9>n1", "n1 n2", nil, "error"},
		{"promote once added", "n1,n2,n4>n1", "n1 n2 n3 n4?", nil, "promote n4 n4:1"},
		// Every wanted replica votes: then the surplus goes.
		{"remove the surplus", "n1,n2,n4>n1", "n1 n2 n3 n4", nil, "remove n3"},
		// A dead replica the map still wants stays (placement replaces it).
		{"a dead wanted replica stays", "n1,n2,n3>n1", "n1 n2 n3", []string{"n3"}, "none"},
		// The leader itself is surplus: it hands off to the preferred one.
		{"leader leaves", "n2,n3,n4>n3", "n1 n2 n3 n4", nil, "hand off to n3 n3:1"},
		// The leader is never removed as dead by itself.
		{"leader leaves, seen dead", "n2,n3,n4>n3", "n1 n2 n3 n4", []string{"n1"}, "hand off to n3 n3:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reps, pref, _ := strings.Cut(tc.replicas, ">")
			cm := testMap(3, []string{"n1", "n2", "n3", "n4"}, tc.replicas)
			sh := cm.Shards[0]
			sh.Replicas, sh.PreferredLeader = strings.Split(reps, ","), pref
			var servers []Server
			for _, s := range strings.Fields(tc.servers) {
				id, nonvoter := strings.CutSuffix(s, "?")
				servers = append(servers, Server{ID: id, Address: id + ":1", Voter: !nonvoter})
			}
			ch, err := NextConfigChange(cm, sh, servers, "n1", func(id string) bool { return slices.Contains(tc.dead, id) })
			got := strings.TrimSpace(fmt.Sprintf("%s %s %s", names[ch.Kind], ch.ID, ch.Address))
			if err != nil {
				got = "error"
			}
			if got != tc.want {
				t.Fatalf("%q, want %q", got, tc.want)
			}
		})
	}
}
