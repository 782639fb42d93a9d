package rpc

import (
	"encoding/hex"
	"testing"
	"time"
)

// TestLeaderIDsSortByTime pins what newID promises the state on disk: ids
// of later milliseconds sort after earlier ones (its task table is ordered
// by id, so new tasks append), ids are 32 hex digits, and ids of the same
// millisecond still differ in their 80 random bits.
func TestLeaderIDsSortByTime(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC).UnixNano()
	var prev string
	seen := map[string]bool{}
	for i := range 1000 {
		now := t0 + int64(i/10)*int64(time.Millisecond) // ten ids per millisecond
		id := newID(now)
		if len(id) != 32 {
			t.Fatalf("id %q: %d characters, want 32", id, len(id))
		}
		if _, err := hex.DecodeString(id); err != nil {
			t.Fatalf("id %q is not hex: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("id %q chosen twice", id)
		}
		seen[id] = true
		if i%10 == 0 && prev != "" && id <= prev {
			t.Fatalf("id %q of a later millisecond sorts before %q", id, prev)
		}
		if i%10 == 0 && prev != "" && id[:12] == prev[:12] {
			t.Fatalf("ids %q and %q of different milliseconds share their time", prev, id)
		}
		prev = id
	}
	// The same millisecond: the time is the same, the rest is random.
	a, b := newID(t0), newID(t0)
	if a[:12] != b[:12] || a[12:] == b[12:] {
		t.Fatalf("ids of one millisecond: %q and %q", a, b)
	}
}
