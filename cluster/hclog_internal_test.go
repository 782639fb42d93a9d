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

// TestHCLogRelevels: raft's words for normal events (a fresh start's
// election, a waiting node's empty configuration) log below WARN; a peer
// that cannot be reached stays at WARN.
func TestHCLogRelevels(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want string
	}{
		{"heartbeat timeout reached, starting election", "level=INFO"},
		{"no known peers, aborting election", "level=INFO"},
		{"peer has newer term, stopping replication", "level=INFO"},
		{"failed to contact", "level=WARN"},
		{"something raft calls a warning", "level=WARN"},
	} {
		var buf bytes.Buffer
		newHCLog(slog.New(slog.NewTextHandler(&buf, nil)), slog.LevelInfo).Warn(tc.msg)
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%q logged %q, want %s", tc.msg, buf.String(), tc.want)
		}
	}
}
