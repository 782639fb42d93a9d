package taskstorepb

import (
	"hash/fnv"
	"strings"
)

// DefaultSlots is the size of the hash-slot table a cluster is bootstrapped with.
const DefaultSlots = 1024

// GroupOf returns the consistency group of a queue: the text before its first
// '/', or the whole name when it has none.
func GroupOf(queue string) string {
	group, _, _ := strings.Cut(queue, "/")
	return group
}

// SlotOf maps a consistency group to a hash slot in [0, slots). The hash is
// FNV-1a (32 bit); it is part of the routing contract and must never change.
func SlotOf(group string, slots int) int {
	h := fnv.New32a()
	h.Write([]byte(group))
	return int(h.Sum32() % uint32(slots))
}
