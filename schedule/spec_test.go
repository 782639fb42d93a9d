package schedule

import (
	"testing"
	"time"
)

func ns(s string) int64 {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UnixNano()
}

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		expr  string
		every time.Duration
		zone  string
		after string
		want  string
	}{
		{"0 2 * * *", 0, "", "2026-11-25T12:00:00Z", "2026-11-26T02:00:00Z"},
		// 02:00 in Berlin is 01:00 UTC in winter.
		{"0 2 * * *", 0, "Europe/Berlin", "2026-11-25T12:00:00Z", "2026-11-26T01:00:00Z"},
		{"*/15 * * * *", 0, "", "2026-11-25T12:07:00Z", "2026-11-25T12:15:00Z"},
		{"@hourly", 0, "", "2026-11-25T12:00:00Z", "2026-11-25T13:00:00Z"},
		{"", 90 * time.Second, "", "2026-11-25T12:00:00Z", "2026-11-25T12:01:30Z"},
	} {
		s, err := Parse(tc.expr, tc.every, tc.zone)
		if err != nil {
			t.Fatalf("%q %v %q: %v", tc.expr, tc.every, tc.zone, err)
		}
		if got := s.Next(ns(tc.after)); got != ns(tc.want) {
			t.Errorf("%q %v %q after %s: %s, want %s", tc.expr, tc.every, tc.zone, tc.after, time.Unix(0, got).UTC(), tc.want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		expr  string
		every time.Duration
		zone  string
	}{
		{"", 0, ""},
		{"* * * * *", time.Minute, ""},
		{"61 * * * *", 0, ""},
		{"* * * *", 0, ""},
		{"* * * * *", 0, "Mars/Olympus"},
		{"", time.Millisecond, ""},
		{"", time.Minute, "UTC"},
	} {
		if _, err := Parse(tc.expr, tc.every, tc.zone); err == nil {
			t.Errorf("Parse(%q, %v, %q) accepted", tc.expr, tc.every, tc.zone)
		}
	}
}

func TestFire(t *testing.T) {
	s, err := Parse("0 * * * *", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	tick := ns("2026-11-25T12:00:00Z")
	// On time: the next hour, insert.
	if next, insert := s.Fire(tick, tick+int64(2*time.Second), false); next != ns("2026-11-25T13:00:00Z") || !insert {
		t.Errorf("on time: %v %v", time.Unix(0, next).UTC(), insert)
	}
	// Three hours late: the ticks missed collapse; skip or catch up once.
	late := ns("2026-11-25T15:30:00Z")
	if next, insert := s.Fire(tick, late, false); next != ns("2026-11-25T16:00:00Z") || insert {
		t.Errorf("late, skip: %v %v", time.Unix(0, next).UTC(), insert)
	}
	if _, insert := s.Fire(tick, late, true); !insert {
		t.Error("late, catch up: nothing inserted")
	}
}

// TestFireKeepsPhase: an interval fired late goes on from its own ticks,
// not from the late moment (a leader always fires a little late), and a
// huge interval neither overflows nor is accepted past MaxEvery.
func TestFireKeepsPhase(t *testing.T) {
	s, err := Parse("", time.Minute, "")
	if err != nil {
		t.Fatal(err)
	}
	tick := ns("2026-11-25T12:00:00Z")
	if next, _ := s.Fire(tick, tick+int64(300*time.Millisecond), false); next != ns("2026-11-25T12:01:00Z") {
		t.Errorf("fired 300ms late: next %v, want 12:01:00", time.Unix(0, next).UTC())
	}
	if next, insert := s.Fire(tick, ns("2026-11-25T12:05:30Z"), false); next != ns("2026-11-25T12:06:00Z") || insert {
		t.Errorf("5m30s late: next %v insert %v, want 12:06:00 and skipped", time.Unix(0, next).UTC(), insert)
	}
	if _, err := Parse("", MaxEvery+time.Hour, ""); err == nil {
		t.Error("an interval past MaxEvery was accepted")
	}
	long, err := Parse("", MaxEvery, "")
	if err != nil {
		t.Fatal(err)
	}
	if next := long.Next(1<<63 - 1 - int64(time.Hour)); next <= 0 {
		t.Errorf("Next overflowed to %d", next)
	}
}
