package control

import (
	"fmt"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// TestMoveSteps: each phase's steps, in order, and on which shard.
func TestMoveSteps(t *testing.T) {
	names := map[MoveStepKind]string{MoveCopy: "copy", MoveFlip: "flip", MoveActivate: "activate", MoveDrop: "drop", MoveUnfreeze: "unfreeze", MoveEnd: "end"}
	for _, tc := range []struct {
		phase metapb.SlotMove_Phase
		want  string
	}{
		{metapb.SlotMove_COPYING, "[copy@1 flip@0]"},
		{metapb.SlotMove_FLIPPED, "[activate@2 drop@1 end@0]"},
		{metapb.SlotMove_ABORTING, "[drop@2 unfreeze@1 end@0]"},
		{metapb.SlotMove_DONE, "[]"},
		{metapb.SlotMove_ABORTED, "[]"},
	} {
		var got []string
		for _, s := range MoveSteps(&metapb.SlotMove{Id: 1, Slot: 7, From: 1, To: 2, Phase: tc.phase}) {
			got = append(got, fmt.Sprintf("%s@%d", names[s.Kind], s.Shard))
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("%v: %v, want %s", tc.phase, got, tc.want)
		}
	}
}

// TestAbandonCopy: a refusal gives up at once; a failure only once it has
// lasted longer than the timeout.
func TestAbandonCopy(t *testing.T) {
	for _, tc := range []struct {
		refused bool
		for_    time.Duration
		want    bool
	}{
		{false, 0, false},
		{true, 0, true},
		{false, 30 * time.Second, false},
		{false, 31 * time.Second, true},
	} {
		if got := AbandonCopy(tc.refused, tc.for_, 30*time.Second); got != tc.want {
			t.Errorf("refused %v, failing for %s: %v, want %v", tc.refused, tc.for_, got, tc.want)
		}
	}
}
