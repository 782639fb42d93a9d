package cluster

import "testing"

// TestFsyncStaysOn guards DESIGN §4: an acknowledged write is fsynced on a
// majority, so raft-boltdb's NoSync must stay false.
func TestFsyncStaysOn(t *testing.T) {
	if noSync {
		t.Fatal("raft-boltdb NoSync is on: acknowledged writes could be lost on power failure")
	}
}
