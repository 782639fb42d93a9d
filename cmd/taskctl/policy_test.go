package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client/clienttest"
)

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"50/s", 50, true},
		{"50", 50, true},
		{"120/m", 2, true},
		{"36/h", 0.01, true},
		{"0", 0, true},
		{"-1/s", 0, false},
		{"5/d", 0, false},
		{"fast", 0, false},
	} {
		got, err := parseRate(c.in)
		if (err == nil) != c.ok || c.ok && got != c.want {
			t.Errorf("parseRate(%q) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
	for _, c := range []struct {
		r    float64
		want string
	}{{50, "50/s"}, {0.5, "30/m"}, {1.0 / 3600, "1/h"}} {
		if got := formatRate(c.r); got != c.want {
			t.Errorf("formatRate(%v) = %q, want %q", c.r, got, c.want)
		}
	}
	if got := policyColumn(&taskstorepb.QueuePolicy{Rate: 50, Burst: 5}); got != "rate 50/s burst 5" {
		t.Errorf("policy column %q", got)
	}
	if got := policyColumn(nil); got != "-" {
		t.Errorf("no policy's column %q", got)
	}
}

// TestQueuePolicyRate: taskctl queue policy sets a rate with the burst the
// cluster fills in, prints with -o json what the policy is now and what it
// was, lists it in queue list, and refuses a burst without a rate.
func TestQueuePolicyRate(t *testing.T) {
	fc := clienttest.New(t, 3, 2)
	if out := mustRun(t, fc, "queue", "policy", "rt/q", "--rate", "50/s"); !strings.Contains(out, "no more than 50/s, in bursts of up to 5 (was no policy)") {
		t.Fatalf("queue policy --rate 50/s printed %q", out)
	}
	var got map[string]struct {
		Rate  float64 `json:"rate"`
		Burst uint32  `json:"burst"`
	}
	out := mustRun(t, fc, "-o", "json", "queue", "policy", "rt/q", "--rate", "120/m", "--burst", "3")
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-o json printed %q: %v", out, err)
	}
	if now, was := got["policy"], got["previous"]; now.Rate != 2 || now.Burst != 3 || was.Rate != 50 || was.Burst != 5 {
		t.Fatalf("-o json after a change printed %q, want the policy now (2/s, burst 3) and before (50/s, burst 5)", out)
	}
	if out := mustRun(t, fc, "queue", "list", "rt/"); !strings.Contains(out, "rate 2/s burst 3") {
		t.Fatalf("queue list shows no rate:\n%s", out)
	}
	if r := run(t, fc, "queue", "policy", "rt/x", "--burst", "3"); r.code == 0 || !strings.Contains(r.stderr, "needs a rate") {
		t.Fatalf("--burst without a rate: exit %d, stderr %q", r.code, r.stderr)
	}
}
