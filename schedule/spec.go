package schedule

import (
	"errors"
	"fmt"
	"time"
	_ "time/tzdata" // images built FROM scratch have no zoneinfo

	"github.com/robfig/cron/v3"
)

// MinEvery and MaxEvery bound a schedule's interval.
const (
	MinEvery = time.Second
	MaxEvery = 10 * 365 * 24 * time.Hour
)

// Spec is a schedule's timing.
type Spec struct {
	cron  cron.Schedule // nil for an interval
	every time.Duration
}

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse reads a cron expression (five fields: minute hour day-of-month month
// day-of-week, or a descriptor such as @daily) evaluated in zone (an IANA
// name; empty means UTC), or an interval every; exactly one of expr and
// every.
func Parse(expr string, every time.Duration, zone string) (Spec, error) {
	switch {
	case expr != "" && every != 0:
		return Spec{}, errors.New("give a cron expression or an interval, not both")
	case expr == "" && every == 0:
		return Spec{}, errors.New("give a cron expression or an interval")
	case every != 0:
		if every < MinEvery || every > MaxEvery {
			return Spec{}, fmt.Errorf("interval %v: between %v and %v", every, MinEvery, MaxEvery)
		}
		if zone != "" {
			return Spec{}, errors.New("a time zone applies to a cron expression only")
		}
		return Spec{every: every}, nil
	}
	loc := time.UTC
	if zone != "" {
		var err error
		if loc, err = time.LoadLocation(zone); err != nil {
			return Spec{}, fmt.Errorf("time zone %q: %v", zone, err)
		}
	}
	s, err := parser.Parse(expr)
	if err != nil {
		return Spec{}, fmt.Errorf("cron expression %q: %v", expr, err)
	}
	if ss, ok := s.(*cron.SpecSchedule); ok {
		ss.Location = loc
	}
	return Spec{cron: s}, nil
}

// Next is the first tick strictly after t (Unix ns). An interval's ticks are
// t + every; a cron expression's, its matching times in its zone.
func (s Spec) Next(t int64) int64 {
	if s.cron == nil {
		return addSat(t, int64(s.every))
	}
	next := s.cron.Next(time.Unix(0, t))
	if next.IsZero() {
		return 1<<63 - 1 // never again
	}
	return next.UnixNano()
}

// Grace is how late a tick may fire and still count as on time (or the
// interval between ticks, if shorter): a leader busy for a moment fires
// late; one elected after an outage fires ticks missed.
const Grace = time.Minute

// Fire decides what the leader does with a schedule's due tick at now:
// the next tick to wait for (the first after now: ticks missed while no
// leader fired collapse into this one), and whether to insert a task: yes
// when the tick is on time (within Grace, or the interval if shorter), and
// for a missed one only with catchUp (one task for all of them).
func (s Spec) Fire(tick, now int64, catchUp bool) (next int64, insert bool) {
	switch {
	case now <= tick:
		next = s.Next(tick)
	case s.cron == nil:
		// An interval keeps its phase: the first tick + k*every after
		// now, not now + every (a leader always fires a little late).
		e := int64(s.every)
		next = addSat(tick, addSat((now-tick)/e*e, e))
	default:
		next = s.Next(now)
	}
	grace := int64(Grace)
	if gap := s.Next(tick) - tick; gap > 0 && gap < grace {
		grace = gap
	}
	return next, now-tick <= grace || catchUp
}

// addSat is a+b for b >= 0, saturated at the largest time.
func addSat(a, b int64) int64 {
	if c := a + b; c >= a {
		return c
	}
	return 1<<63 - 1
}
