package client

import (
	"slices"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// Moves finish out of id order (the mover drives up to 32 at once) and a
// node lists only the last 64 to finish. TestShardsAddRebalanceRemove
// waited forever on a rebalance whose 512 moves had all finished: a move
// that fell off the list had a higher id than one that finished late and
// was still listed, so "older than the oldest listed" never held for it.
func TestSettledMovesFinishedOutOfOrder(t *testing.T) {
	var moves []*taskstorepb.SlotMove
	pending := map[uint64]bool{}
	for id := uint64(1); id <= 100; id++ {
		moves = append(moves, &taskstorepb.SlotMove{Id: id, Slot: uint32(id), From: 1, To: 2})
		pending[id] = true
	}
	st := &taskstorepb.StatusResponse{
		// 98 and 100 are still under way.
		Moves: []*taskstorepb.SlotMove{{Id: 98, Phase: "copying"}, {Id: 100, Phase: "flipped"}},
	}
	// The last 64 to finish: 5 (late) and 36..99 but 98, and 60 aborted.
	st.FinishedMoves = append(st.FinishedMoves, &taskstorepb.SlotMove{Id: 5, Phase: "done"})
	for id := uint64(36); id <= 99; id++ {
		if id == 98 {
			continue
		}
		phase := "done"
		if id == 60 {
			phase = "aborted"
		}
		st.FinishedMoves = append(st.FinishedMoves, &taskstorepb.SlotMove{Id: id, Phase: phase})
	}
	listed, dropped := settledMoves(st, moves, pending)
	ids := func(ms []*taskstorepb.SlotMove) []uint64 {
		var out []uint64
		for _, m := range ms {
			out = append(out, m.Id)
		}
		slices.Sort(out)
		return out
	}
	var wantListed, wantDropped []uint64
	wantListed = append(wantListed, 5)
	for id := uint64(1); id <= 97; id++ {
		switch {
		case id >= 36:
			wantListed = append(wantListed, id)
		case id != 5:
			wantDropped = append(wantDropped, id)
		}
	}
	wantListed = append(wantListed, 99)
	slices.Sort(wantListed)
	if got := ids(listed); !slices.Equal(got, wantListed) {
		t.Errorf("listed finished: %v, want %v", got, wantListed)
	}
	if got := ids(dropped); !slices.Equal(got, wantDropped) {
		t.Errorf("finished and dropped from the list: %v, want %v", got, wantDropped)
	}

	// A node whose map trails knows moves up to 40 only: 41..100 are not
	// taken for finished.
	trailing := &taskstorepb.StatusResponse{FinishedMoves: []*taskstorepb.SlotMove{{Id: 40, Phase: "done"}}}
	listed, dropped = settledMoves(trailing, moves, pending)
	if got := ids(listed); !slices.Equal(got, []uint64{40}) {
		t.Errorf("trailing node: listed %v, want [40]", got)
	}
	if got := ids(dropped); len(got) != 39 || got[0] != 1 || got[38] != 39 {
		t.Errorf("trailing node: dropped %v, want 1..39", got)
	}
}
