package cluster_test

import (
	"bufio"
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/testing/harness"
)

// lockedBuffer collects log lines from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logKeys returns the attribute keys of one slog text line, in order.
func logKeys(line string) []string {
	var keys []string
	for i := 0; i < len(line); {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		eq := strings.IndexByte(line[i:], '=')
		if eq < 0 {
			break
		}
		keys = append(keys, line[i:i+eq])
		i += eq + 1
		if i < len(line) && line[i] == '"' { // a quoted value: skip to its closing quote
			for i++; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' {
					i++
				}
			}
			i++
		} else {
			for i < len(line) && line[i] != ' ' {
				i++
			}
		}
	}
	return keys
}

// TestLogLinesDoNotRepeatAttributes runs a cluster through writes, a
// leadership transfer and a restart, and reads every log line: none names
// an attribute twice (they read "node=n1 component=node node=n1").
func TestLogLinesDoNotRepeatAttributes(t *testing.T) {
	var logs lockedBuffer
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: raceScale, Logs: &logs, LogLevel: slog.LevelDebug})
	c.WaitReady()
	insert(t, c, "logs/q", "a", "v")
	if err := c.TransferLeader(c.ShardOf("logs/q"), -1); err != nil {
		t.Log(err) // a refused transfer still logs
	}
	c.Stop(2)
	c.Restart(2)
	c.WaitReady()
	insert(t, c, "logs/q", "b", "v")
	time.Sleep(200 * time.Millisecond)
	lines, withNode := 0, 0
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines++
		seen := map[string]bool{}
		for _, k := range logKeys(sc.Text()) {
			if seen[k] {
				t.Errorf("attribute %q twice: %s", k, sc.Text())
				break
			}
			seen[k] = true
		}
		if seen["node"] {
			withNode++
		}
	}
	if lines == 0 || withNode == 0 {
		t.Fatalf("%d log lines, %d naming their node: the test read nothing", lines, withNode)
	}
}

// TestFreshStartLogsNoAlarm starts a 3-node cluster with 8 shards: its
// first elections are normal events, so nothing logs at ERROR and no
// election logs at WARN (a fresh start used to log nine "heartbeat timeout
// reached, starting election" warnings and "peer has newer term" errors).
func TestFreshStartLogsNoAlarm(t *testing.T) {
	var logs lockedBuffer
	c := harness.Start(t, 3, harness.Options{Shards: 8, Scale: raceScale, Logs: &logs, LogLevel: slog.LevelDebug})
	c.WaitReady()
	leading := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `msg=leading`) {
			leading++
		}
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") && strings.Contains(l, "starting election") {
			t.Errorf("a fresh start logged: %s", l)
		}
	}
	if leading == 0 {
		t.Fatal("no replica logged that it leads: the test read nothing")
	}
}

// TestClusterStopLogsNoAlarm stops a whole cluster together, as Ctrl-C on
// the dev cluster does: no WARN or ERROR line, and one "node stopped" per
// node (it printed a screen of failed hand-offs and appendEntries errors).
func TestClusterStopLogsNoAlarm(t *testing.T) {
	var logs lockedBuffer
	c := harness.Start(t, 3, harness.Options{Shards: 8, Scale: raceScale, Logs: &logs, LogLevel: slog.LevelDebug})
	c.WaitReady()
	insert(t, c, "stop/q", "a", "v")
	time.Sleep(100 * time.Millisecond)
	from := len(logs.String())
	if err := c.StopAll(); err != nil {
		t.Fatal(err)
	}
	stopped := 0
	for _, l := range strings.Split(logs.String()[from:], "\n") {
		if strings.Contains(l, `msg="node stopped"`) {
			stopped++
		}
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
			t.Errorf("stopping the cluster logged: %s", l)
		}
	}
	if stopped != 3 {
		t.Errorf("%d nodes said they stopped, want 3", stopped)
	}
}
