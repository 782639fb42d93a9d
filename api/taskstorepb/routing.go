package taskstorepb

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// DefaultSlots is the size of the hash-slot table a cluster is bootstrapped with.
const DefaultSlots = 1024

// CheckQueue is the rule every queue name a request routes by follows: its
// consistency group is not empty. Clients, proxies, nodes and the state
// machine's validation all refuse with this text, so that a name is refused
// the same way whatever the call.
func CheckQueue(queue string) error {
	if strings.HasPrefix(queue, "/") {
		return fmt.Errorf("%q: a queue name must not start with '/' (its group would be empty)", queue)
	}
	return nil
}

// CheckNewQueue is CheckQueue for a name that a request puts tasks in (an
// insert, a move, a schedule): it must not end with '/' either, which would
// name nothing after its group. Reads, claims, deletes and purges of such a
// queue, made before the rule, still work, so that it can be drained.
func CheckNewQueue(queue string) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	if strings.HasSuffix(queue, "/") {
		return fmt.Errorf("%q: a queue name must not end with '/' (name the group's own queue %q, or a queue under it)", queue, strings.TrimRight(queue, "/"))
	}
	return nil
}

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
