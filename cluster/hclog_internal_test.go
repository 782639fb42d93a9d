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

// TestHCLogRepeatsOfAPeerFailureLogOnce: a peer that is down fails every
// heartbeat and append of every group the node leads (~200 WARN lines in
// the 10 s a dev node was down). Each (message, peer) logs at WARN once per
// repeatEvery across all the node's groups, the repeats at DEBUG, and the
// next WARN says how many were not shown. Other peers and other messages
// are not held back.
func TestHCLogRepeatsOfAPeerFailureLogOnce(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := newHCLog(slog.New(slog.NewTextHandler(&buf, nil)), slog.LevelInfo)
	l.(*hclogAdapter).repeats = newRepeatLimiter(repeatEvery, func() time.Time { return now })
	groups := []interface{ Warn(string, ...interface{}) }{l.With("shard", 1), l.With("shard", 2).Named("raft")}
	for i := range 100 {
		groups[i%2].Warn("failed to heartbeat to", "peer", "127.0.0.1:7102", "backoff time", "10ms")
		groups[i%2].Warn("failed to contact", "server-id", "n2", "time", time.Second)
	}
	groups[0].Warn("failed to heartbeat to", "peer", "127.0.0.1:7103")
	groups[0].Warn("heartbeat timeout reached, starting election")
	if got := strings.Count(buf.String(), "level=WARN"); got != 3 {
		t.Fatalf("%d WARN lines, want 3 (one per peer and message):\n%s", got, buf.String())
	}
	if !strings.Contains(buf.String(), "level=INFO msg=\"heartbeat timeout reached") {
		t.Fatalf("an unlimited message was held back:\n%s", buf.String())
	}
	buf.Reset()
	now = now.Add(repeatEvery)
	groups[1].Warn("failed to heartbeat to", "peer", "127.0.0.1:7102")
	if line := buf.String(); !strings.Contains(line, "level=WARN") || !strings.Contains(line, "repeats_not_shown=99") {
		t.Fatalf("after %v the failure logs again with the count held back; got %q", repeatEvery, line)
	}
}

// TestMemberlistLineLosesItsTimestamp: memberlist writes through a standard
// logger ("2026/11/25 14:46:24 [WARN] memberlist: ..."); the message keeps
// only its words, so a line has one time.
func TestMemberlistLineLosesItsTimestamp(t *testing.T) {
	var buf bytes.Buffer
	w := &levelFilterWriter{log: slog.New(slog.NewTextHandler(&buf, nil))}
	w.Write([]byte("2026/11/25 14:46:24 [WARN] memberlist: Refuting a suspect message (from: n2)\n"))
	if line := buf.String(); !strings.Contains(line, `level=WARN msg="Refuting a suspect message (from: n2)"`) || strings.Contains(line, "2026/11/25") {
		t.Fatalf("line: %s", line)
	}
	for in, want := range map[string]string{
		"[ERR] memberlist: Failed to send": "Failed to send",
		"no level at all":                  "no level at all",
		"2026/11/25 14:46:24 [INFO] x [y]": "x [y]",
	} {
		if got := memberlistMessage(in); got != want {
			t.Errorf("memberlistMessage(%q) = %q, want %q", in, got, want)
		}
	}
}
