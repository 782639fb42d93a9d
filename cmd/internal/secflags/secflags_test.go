package secflags

import (
	"bytes"
	"encoding/base64"
	"log/slog"
	"strings"
	"testing"
)

// TestGossipKeyOffTheCommandLine: a key given as a flag works but is
// warned about (it shows in the process list and /debug/pprof/cmdline);
// the environment variable is read when no flag names a key.
func TestGossipKeyOffTheCommandLine(t *testing.T) {
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	load := func(s *Server) (Security, string) {
		t.Helper()
		var buf bytes.Buffer
		sec, err := s.Load(slog.New(slog.NewTextHandler(&buf, nil)), true)
		if err != nil {
			t.Fatal(err)
		}
		return sec, buf.String()
	}
	t.Setenv(GossipKeyEnv, "")
	sec, logs := load(&Server{GossipKey: key})
	if len(sec.GossipKeys) != 1 || !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "--gossip-key puts the key on the command line") {
		t.Fatalf("--gossip-key: %d keys, logs %q; want the key and a warning", len(sec.GossipKeys), logs)
	}
	t.Setenv(GossipKeyEnv, key)
	sec, logs = load(&Server{})
	if len(sec.GossipKeys) != 1 || !bytes.Equal(sec.GossipKeys[0], bytes.Repeat([]byte{7}, 32)) || strings.Contains(logs, "command line") {
		t.Fatalf("$%s: %d keys, logs %q; want the key, no warning", GossipKeyEnv, len(sec.GossipKeys), logs)
	}
}
