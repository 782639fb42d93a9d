package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestHCLogKeepsKeysUnique: raft's "failed to contact" carries time=1s,
// which made a second time= in the line; such keys get a raft_ prefix.
func TestHCLogKeepsKeysUnique(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLog(slog.New(slog.NewTextHandler(&buf, nil)).With("node", "n1"), slog.LevelInfo)
	l.Warn("failed to contact", "server-id", "n3", "time", time.Second, "node", "n9")
	line := buf.String()
	if strings.Count(line, " time=") != 0 || strings.Count(line, "time=") != 2 || !strings.Contains(line, "raft_time=1s") ||
		strings.Count(line, " node=") != 1 || !strings.Contains(line, "raft_node=n9") {
		t.Fatalf("line: %s", line)
	}
}
