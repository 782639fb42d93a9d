package fsm

import (
	"bytes"
	"testing"
)

// TestBareSmallIsTheSnapshotsBytes: the on-disk store's small record of a
// state with no pauses, limits, schedules, policies or slot states,
// written without the snapshot writer, is byte for byte what the snapshot
// writer writes (the record is hashed into the replicas' digest, and
// loadSmall reads it back), and a state with any of them goes through the
// writer.
func TestBareSmallIsTheSnapshotsBytes(t *testing.T) {
	for _, c := range []struct {
		format    uint32
		taskBytes int64
	}{{0, 0}, {0, 12345}, {MaxFormat, 0}, {MaxFormat, 1 << 40}, {FormatMemoryBudget, -7}} {
		st := newState()
		st.format, st.taskBytes = c.format, c.taskBytes
		bare, full := st.encodeBareSmall(), st.encodeSmallSnapshot()
		if !bytes.Equal(bare, full) {
			t.Errorf("format %d, task bytes %d: bare %x, through the snapshot writer %x", c.format, c.taskBytes, bare, full)
		}
		back := newState()
		if err := back.loadSmall(bare); err != nil || back.format != c.format || back.taskBytes != max(c.taskBytes, 0) {
			t.Errorf("format %d, task bytes %d: read back as format %d, task bytes %d (%v)", c.format, c.taskBytes, back.format, back.taskBytes, err)
		}
	}
	st := newState()
	st.format = MaxFormat
	st.limits["g/q"] = 3
	if got, want := st.encodeSmall(), st.encodeSmallSnapshot(); !bytes.Equal(got, want) || bytes.Equal(got, st.encodeBareSmall()) {
		t.Errorf("a state with a queue limit: encodeSmall %x, want the snapshot writer's %x", got, want)
	}
}
