package cluster

import (
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// maxFinishedMoves bounds ClusterMap.finished.
const maxFinishedMoves = 64

// applyMove applies the slot-move ops of the meta log (cluster/slotmove.go
// drives them). Each checks the map and is ignored when it does not fit,
// on every replica alike, so a stale or repeated proposal changes nothing.
func applyMove(cm *metapb.ClusterMap, cmd *metapb.Command) bool {
	if cmd.Op == metapb.Op_OP_MOVE_BEGIN && len(cmd.Moves) > 0 {
		changed := false
		for _, m := range cmd.Moves {
			if applyMove(cm, &metapb.Command{Op: metapb.Op_OP_MOVE_BEGIN, Move: m}) {
				changed = true
			}
		}
		return changed
	}
	want := cmd.Move
	if want == nil {
		return false
	}
	switch cmd.Op {
	case metapb.Op_OP_MOVE_BEGIN:
		if int(want.Slot) >= len(cm.Slots) || cm.Slots[want.Slot] != want.From || want.From == want.To ||
			control.FindShard(cm, want.To) == nil || control.FindShard(cm, want.To).Retiring || control.MoveOfSlot(cm, want.Slot) != nil {
			return false
		}
		cm.LastMove++
		cm.Moves = append(cm.Moves, &metapb.SlotMove{Id: cm.LastMove, Slot: want.Slot, From: want.From, To: want.To,
			Phase: metapb.SlotMove_COPYING, Begun: want.Begun})
		return true
	case metapb.Op_OP_MOVE_FLIP:
		mv := findMove(cm, want.Id)
		if mv == nil || mv.Phase != metapb.SlotMove_COPYING || cm.Slots[mv.Slot] != mv.From {
			return false
		}
		cm.Slots[mv.Slot] = mv.To
		mv.Phase = metapb.SlotMove_FLIPPED
		return true
	case metapb.Op_OP_MOVE_ABORT:
		mv := findMove(cm, want.Id)
		if mv == nil || mv.Phase != metapb.SlotMove_COPYING {
			return false
		}
		mv.Phase, mv.Error = metapb.SlotMove_ABORTING, want.Error
		return true
	case metapb.Op_OP_MOVE_END:
		i := slices.IndexFunc(cm.Moves, func(m *metapb.SlotMove) bool { return m.Id == want.Id })
		if i < 0 || cm.Moves[i].Phase == metapb.SlotMove_COPYING {
			return false
		}
		mv := cm.Moves[i]
		cm.Moves = slices.Delete(cm.Moves, i, i+1)
		if mv.Phase == metapb.SlotMove_FLIPPED {
			mv.Phase = metapb.SlotMove_DONE
		} else {
			mv.Phase = metapb.SlotMove_ABORTED
		}
		cm.Finished = append(cm.Finished, mv)
		if len(cm.Finished) > maxFinishedMoves {
			cm.Finished = slices.Delete(cm.Finished, 0, len(cm.Finished)-maxFinishedMoves)
		}
		return true
	}
	return false
}

func findMove(cm *metapb.ClusterMap, id uint64) *metapb.SlotMove {
	for _, m := range cm.Moves {
		if m.Id == id {
			return m
		}
	}
	return nil
}

// applyShardOp applies the ops that add and remove shards; like the move
// ops, one that does not fit the map is ignored.
func applyShardOp(cm *metapb.ClusterMap, cmd *metapb.Command) bool {
	want := cmd.Shard
	if want == nil || want.Id == MetaGroupID {
		return false
	}
	have := control.FindShard(cm, want.Id)
	switch cmd.Op {
	case metapb.Op_OP_ADD_SHARD:
		if have != nil || len(want.Replicas) == 0 || want.Id <= control.LastShard(cm) {
			return false
		}
		cm.LastShard = want.Id
		sh := proto.Clone(want).(*metapb.Shard)
		sh.Retiring = false
		normalizeShard(sh)
		cm.Shards = append(cm.Shards, sh)
		return true
	case metapb.Op_OP_RETIRE_SHARD:
		if have == nil || have.Retiring {
			return false
		}
		others := 0
		for _, s := range cm.Shards {
			if s.Id != have.Id && !s.Retiring {
				others++
			}
		}
		if others == 0 {
			return false // the last shard serving slots stays
		}
		have.Retiring = true
		return true
	case metapb.Op_OP_DROP_SHARD:
		if have == nil || !have.Retiring || slices.Contains(cm.Slots, have.Id) {
			return false
		}
		for _, m := range cm.Moves {
			if m.From == have.Id || m.To == have.Id {
				return false
			}
		}
		cm.Shards = slices.DeleteFunc(cm.Shards, func(s *metapb.Shard) bool { return s.Id == have.Id })
		return true
	}
	return false
}
