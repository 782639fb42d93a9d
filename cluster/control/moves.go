package control

import (
	"time"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// A slot move's phases (metapb.SlotMove.Phase), each carried out as a
// list of steps on the shards' and the meta group's logs by the node's
// slot mover:
//
//	COPYING   MoveCopy on From to To (source FREEZE; target DROP of what an
//	          earlier attempt left; IMPORT chunk after chunk), then
//	          MoveFlip: the routing table names the target.
//	FLIPPED   MoveActivate on To; MoveDrop on From; MoveEnd.
//	ABORTING  MoveDrop on To; MoveUnfreeze on From; MoveEnd.
//
// Every step is safe to repeat, so a new meta leader resumes a move from
// its phase (a copy starts over).

// MoveStepKind is one step of a slot move's phase.
type MoveStepKind int

const (
	// MoveCopy freezes the slot on the source and copies it to the target.
	MoveCopy MoveStepKind = iota + 1
	// MoveFlip records in the meta log that the target serves the slot
	// (OP_MOVE_FLIP).
	MoveFlip
	// MoveActivate lets the target serve the slot it imported.
	MoveActivate
	// MoveDrop deletes the slot from Shard, a bounded number of tasks per
	// entry, until none is left.
	MoveDrop
	// MoveUnfreeze lets the source serve the slot again.
	MoveUnfreeze
	// MoveEnd records in the meta log that the move is over
	// (OP_MOVE_END).
	MoveEnd
)

// MoveStep is a step and the shard it runs on (0: the meta group).
type MoveStep struct {
	Kind  MoveStepKind
	Shard uint32
}

// MoveSteps is what takes a move one phase further, in order; none for a
// move that is over.
func MoveSteps(mv *metapb.SlotMove) []MoveStep {
	switch mv.Phase {
	case metapb.SlotMove_COPYING:
		return []MoveStep{{MoveCopy, mv.From}, {MoveFlip, 0}}
	case metapb.SlotMove_FLIPPED:
		return []MoveStep{{MoveActivate, mv.To}, {MoveDrop, mv.From}, {MoveEnd, 0}}
	case metapb.SlotMove_ABORTING:
		return []MoveStep{{MoveDrop, mv.To}, {MoveUnfreeze, mv.From}, {MoveEnd, 0}}
	}
	return nil
}

// AbandonCopy reports whether a copy that failed is given up (the move
// aborted, the slot served where it was): when a shard refused a step, or
// the copy has kept failing for longer than timeout (meanwhile the slot's
// writers wait). failingFor is how long since its first failure (0 for
// the first).
func AbandonCopy(refused bool, failingFor, timeout time.Duration) bool {
	return refused || failingFor > timeout
}
