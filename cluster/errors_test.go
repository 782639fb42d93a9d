package cluster

import (
	"strings"
	"testing"
)

// TestNotLeaderErrorSaysWhy: a diverged replica's refusal names the cause
// whether or not another replica is known (right after a restart the map
// is not loaded yet, and the refusal once read "leader unknown").
func TestNotLeaderErrorSaysWhy(t *testing.T) {
	const why = "this node's replica diverged"
	for _, tc := range []struct {
		err      *NotLeaderError
		contains []string
	}{
		{&NotLeaderError{Shard: 3}, []string{"shard 3", "leader unknown"}},
		{&NotLeaderError{Shard: 3, LeaderID: "n2", LeaderAddress: "a:1"}, []string{"leader is n2 at a:1"}},
		{&NotLeaderError{Shard: 3, Why: why}, []string{why, "no other replica is known yet"}},
		{&NotLeaderError{Shard: 3, Why: why, Replica: true, LeaderID: "n2", LeaderAddress: "a:1"}, []string{why, "n2 at a:1 has one"}},
		{&NotLeaderError{Shard: 3, Replica: true, LeaderID: "n2", LeaderAddress: "a:1"}, []string{"no replica on this node"}},
	} {
		msg := tc.err.Error()
		for _, c := range tc.contains {
			if !strings.Contains(msg, c) {
				t.Errorf("%+v: %q lacks %q", *tc.err, msg, c)
			}
		}
	}
}
