package taskstorepb

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

// CompactInserted sends each task of r.Inserted in full once: an entry that
// repeats an earlier entry's task (same id and version: if_absent inserts
// coalesced into it) is replaced by a copy without its value, and SameAs
// names the entry that has it. Nodes and proxies call it before answering.
func CompactInserted(r *ModifyResponse) {
	if len(r.GetCoalesced()) == 0 || len(r.Inserted) < 2 {
		return
	}
	type ref struct {
		id      string
		version uint64
	}
	first := make(map[ref]int, len(r.Inserted))
	for i, t := range r.Inserted {
		k := ref{t.GetId(), t.GetVersion()}
		j, seen := first[k]
		if !seen {
			first[k] = i
			continue
		}
		if len(t.GetValue()) == 0 {
			continue
		}
		v := t.Value
		t.Value = nil
		cp := proto.Clone(t).(*Task)
		t.Value = v
		r.Inserted[i] = cp
		if r.SameAs == nil {
			r.SameAs = map[uint32]uint32{}
		}
		r.SameAs[uint32(i)] = uint32(j)
	}
}

// ExpandInserted undoes CompactInserted: every repeating entry gets the
// value of the entry it names (the same bytes, not a copy) and SameAs is
// cleared. Entries that name no earlier entry are left as they are.
func ExpandInserted(r *ModifyResponse) {
	for i, j := range r.GetSameAs() {
		if int(i) < len(r.Inserted) && j < i && r.Inserted[i] != nil && r.Inserted[j] != nil {
			r.Inserted[i].Value = r.Inserted[j].Value
		}
	}
	if r != nil {
		r.SameAs = nil
	}
}

// QueueHoldReason says why a claim of the queue name finds nothing although
// it may hold available tasks: paused, or at (or, after a lowered limit,
// over) its concurrency limit of maxClaimed with claimed tasks claimed; ""
// when neither. The server answers an empty claim with it
// (ClaimResponse.empty_reason); taskctl words an older server's empty
// answer with it too.
func QueueHoldReason(name string, paused bool, maxClaimed uint32, claimed uint64) string {
	switch {
	case paused:
		return fmt.Sprintf("%s is paused (taskctl queue resume %s)", name, name)
	case maxClaimed > 0 && claimed > uint64(maxClaimed):
		return fmt.Sprintf("%s has %d claimed, over its limit of %d (lowered since): none is claimed until fewer than %d are (taskctl queue limit)",
			name, claimed, maxClaimed, maxClaimed)
	case maxClaimed > 0 && claimed == uint64(maxClaimed):
		return fmt.Sprintf("%s has %d claimed, its limit of %d (taskctl queue limit)", name, claimed, maxClaimed)
	}
	return ""
}
