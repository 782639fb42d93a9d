package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/client/clienttest"
)

// Tests for what a user walk of taskctl found (queue move, queue limit,
// schedule errors, task insert --hold).

// TestQueueMoveRefusedUpFront: a move the client refuses before doing
// anything (across groups, onto itself, a bad batch) prints only the error,
// no summary of nothing moved, in either output format.
func TestQueueMoveRefusedUpFront(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	mustRun(t, fc, "task", "insert", "m/dead", "--id", "d1")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "move", "m/dead", "other/x"}, `error: move m/dead to other/x: a move stays within one consistency group ("m", "other")`},
		{[]string{"-o", "json", "queue", "move", "m/dead", "other/x"}, "a move stays within one consistency group"},
		{[]string{"queue", "move", "m/dead", "m/dead"}, "error: move m/dead to itself"},
		{[]string{"queue", "move", "m/dead", "m/work", "--batch", "5000"}, "a batch of 5000 tasks: want 1 to 1000"},
	} {
		r := run(t, fc, tc.args...)
		if r.code == 0 || r.stdout != "" || !strings.HasPrefix(r.stderr, "error: ") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("taskctl %q: exit %d, stdout %q, stderr %q; want exit 1, no stdout and %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	if got := fc.Task("d1"); got == nil || got.Queue != "m/dead" {
		t.Errorf("d1: %v, want it left in m/dead", got)
	}
}

// TestQueueMoveSaysClaimedLeft: tasks a worker holds are not moved, and
// queue move says how many it left (and -o json has them as "claimed").
func TestQueueMoveSaysClaimedLeft(t *testing.T) {
	const left = "claimed task(s) left in m/dead (a worker holds them; move again after their leases end)"
	for _, tc := range []struct {
		name       string
		held       int
		json       bool
		wantOut    []string
		wantNotOut []string
	}{
		{name: "none held", wantOut: []string{"moved 4 task(s) from m/dead to m/work, skipped 0\n"}, wantNotOut: []string{left}},
		{name: "one held", held: 1, wantOut: []string{"moved 3 task(s) from m/dead to m/work, skipped 0\n", "1 " + left + "\n"}},
		{name: "two held", held: 2, wantOut: []string{"moved 2 task(s)", "2 " + left}},
		{name: "json", held: 1, json: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := clienttest.New(t, 3, 2)
			for i := range 4 {
				mustRun(t, fc, "task", "insert", "m/dead", "--id", fmt.Sprintf("d%d", i))
			}
			if tc.held > 0 {
				mustRun(t, fc, "task", "claim", "m/dead", "--limit", fmt.Sprint(tc.held), "--lease", "1h", "--claimant", "w")
			}
			args := []string{"queue", "move", "m/dead", "m/work"}
			if tc.json {
				args = append([]string{"-o", "json"}, args...)
			}
			out := mustRun(t, fc, args...)
			for _, want := range tc.wantOut {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
			for _, not := range tc.wantNotOut {
				if strings.Contains(out, not) {
					t.Errorf("stdout has %q:\n%s", not, out)
				}
			}
			if tc.json {
				var got map[string]any
				if err := json.Unmarshal([]byte(out), &got); err != nil {
					t.Fatalf("not JSON: %v\n%s", err, out)
				}
				if got["moved"] != float64(4-tc.held) || got["claimed"] != float64(tc.held) || got["skipped"] != float64(0) {
					t.Errorf("JSON %v: want moved %d, claimed %d, skipped 0", got, 4-tc.held, tc.held)
				}
			}
		})
	}
}

// TestQueueLimitSaysNoLimit: setting and removing a limit says "no limit",
// not "-" (a table's dash), on either side.
func TestQueueLimitSaysNoLimit(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	for _, tc := range []struct{ n, want string }{
		{"1", "l/q: at most 1 claimed at once (was no limit)\n"},
		{"3", "l/q: at most 3 claimed at once (was 1)\n"},
		{"0", "l/q: no limit (was 3)\n"},
		{"0", "l/q: no limit (was no limit)\n"},
	} {
		if out := mustRun(t, fc, "queue", "limit", "l/q", tc.n); out != tc.want {
			t.Errorf("queue limit l/q %s printed %q, want %q", tc.n, out, tc.want)
		}
	}
}

// TestScheduleErrorsNameTheCommand: a schedule the cluster refuses prints
// the command and the reason, not the RPC's lowercase name and gRPC code.
func TestScheduleErrorsNameTheCommand(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cron", "* * * * *", "--tz", "Mars/Olympus"}, "error: schedule add: time zone \"Mars/Olympus\": unknown time zone Mars/Olympus\n"},
		{[]string{"--cron", "61 * * * *"}, "error: schedule add: cron expression \"61 * * * *\": "},
		{[]string{"--every", "10ms"}, "error: schedule add: "},
	} {
		args := append([]string{"schedule", "add", "nightly", "--queue", "rep/run"}, tc.args...)
		r := run(t, fc, args...)
		if r.code == 0 || !strings.HasPrefix(r.stderr, tc.want) || strings.Contains(r.stderr, "putschedule") || strings.Contains(r.stderr, "InvalidArgument") {
			t.Errorf("taskctl %q: exit %d, stderr %q; want it to start %q", args, r.code, r.stderr, tc.want)
		}
	}
	r := run(t, fc, "schedule", "add", "x/y", "--queue", "rep/run", "--every", "1m")
	if r.code == 0 || r.stderr != "error: schedule add: name: must not contain '@' or '/'\n" {
		t.Errorf("a bad schedule name: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestInsertHoldNeedsClaimant: --hold without an explicit --claimant is
// refused (the default claimant, taskctl-HOST-PID, would hold the task under
// a name no later invocation knows); nothing is inserted.
func TestInsertHoldNeedsClaimant(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--hold", "--delay", "30s"}, "error: --hold needs --claimant: the producer that holds the task until its time\n"},
		{[]string{"--hold", "--delay", "30s", "--claimant", ""}, "error: --hold needs --claimant: the producer that holds the task until its time\n"},
		{[]string{"--hold"}, "error: --hold needs --delay"},
		{[]string{"--hold", "--claimant", "ed"}, "error: --hold needs --delay"},
	} {
		args := append([]string{"task", "insert", "h/q"}, tc.args...)
		if r := run(t, fc, args...); r.code == 0 || !strings.HasPrefix(r.stderr, tc.want) {
			t.Errorf("taskctl %q: exit %d, stderr %q; want %q", args, r.code, r.stderr, tc.want)
		}
	}
	if n := fc.Count(); n != 0 {
		t.Fatalf("%d task(s) inserted, want none", n)
	}
	got := tasksJSON(t, mustRun(t, fc, "-o", "json", "task", "insert", "h/q", "--hold", "--delay", "30s", "--claimant", "ed"))
	if len(got) != 1 || got[0].Claimant != "ed" {
		t.Fatalf("held insert with --claimant: %v", got)
	}
	if out := mustRun(t, fc, "task", "insert", "--help"); !strings.Contains(out, "--hold needs --claimant") && !strings.Contains(out, "required with --hold") {
		t.Errorf("task insert --help does not say --hold needs --claimant:\n%s", out)
	}
}
