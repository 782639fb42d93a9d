package checker

import (
	"fmt"
	"sort"
)

// Replica is one voter of a shard sampled at a barrier: its state
// machine's applied index and digest (fsm.Machine.Digest).
type Replica struct {
	Shard   uint32
	Node    string
	Applied uint64
	Digest  [32]byte
}

// ReplicaAgreement checks that the voters of each shard that applied the
// same index have the same digest, and that every shard's voters reached
// the same applied index (the caller samples after waiting for that). It
// returns the violations and how many replicas it compared.
func ReplicaAgreement(rs []Replica) ([]Violation, int) {
	byShard := map[uint32][]Replica{}
	for _, r := range rs {
		byShard[r.Shard] = append(byShard[r.Shard], r)
	}
	shards := make([]uint32, 0, len(byShard))
	for s := range byShard {
		shards = append(shards, s)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	var out []Violation
	for _, s := range shards {
		reps := byShard[s]
		sort.Slice(reps, func(i, j int) bool { return reps[i].Node < reps[j].Node })
		if len(reps) < 2 {
			out = append(out, Violation{Checker: NameReplicas, Detail: fmt.Sprintf("shard %d: only %d voter sampled", s, len(reps))})
			continue
		}
		ref := reps[0]
		for _, r := range reps[1:] {
			switch {
			case r.Applied != ref.Applied:
				out = append(out, Violation{Checker: NameReplicas, Detail: fmt.Sprintf("shard %d: voters did not converge: %s applied %d, %s applied %d",
					s, ref.Node, ref.Applied, r.Node, r.Applied)})
			case r.Digest != ref.Digest:
				out = append(out, Violation{Checker: NameReplicas, Detail: fmt.Sprintf("shard %d: at applied index %d, %s has digest %x and %s has %x",
					s, r.Applied, ref.Node, ref.Digest[:6], r.Node, r.Digest[:6])})
			}
		}
	}
	return out, len(rs)
}
