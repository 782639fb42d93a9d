package main

import (
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
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
