package fsm

import (
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// scheduleKey names a schedule in the state: its group, then its name.
func scheduleKey(queue, name string) string { return groupOf(queue) + "\x00" + name }

// ScheduleElsewhere starts the message of a SCHEDULE_ELSEWHERE failure: an OP_SCHEDULE that names
// a schedule of the group by another queue than its own.
const ScheduleElsewhere = "schedule of another queue"

// ScheduleTaskID is the id of the task a schedule inserts at tick: the
// schedule's name and the tick in UTC, so a tick's task is recognisable
// and, ids being unique per group, inserted at most once.
func ScheduleTaskID(name string, tick int64) string {
	return name + "@" + time.Unix(0, tick).UTC().Format("2006-01-02T15:04:05.999999999Z")
}

// schedule puts or removes a schedule. A put replaces the schedule of that
// name, keeping its count of fired ticks.
func (a *applier) schedule(s *fsmpb.Schedule) *fsmpb.Result {
	k := scheduleKey(s.Queue, s.Name)
	old := a.st.schedules[k]
	if old != nil && old.Queue != s.Queue {
		// The name is the group's, but the API authorizes by the queue the
		// request names: only that queue's schedule may be replaced or
		// removed by it.
		return failuref(fsmpb.Failure_SCHEDULE_ELSEWHERE, "%s: schedule %q belongs to queue %q; name that queue (or remove it first)", ScheduleElsewhere, s.Name, old.Queue)
	}
	if s.Remove {
		delete(a.st.schedules, k)
	} else {
		ns := proto.Clone(s).(*fsmpb.Schedule)
		ns.Fired, ns.Last = old.GetFired(), old.GetLast()
		a.st.schedules[k] = ns
	}
	return &fsmpb.Result{Schedule: &fsmpb.ScheduleResult{Existed: old != nil}}
}

// fire applies one tick of a schedule (fsmpb.Fire).
func (a *applier) fire(f *fsmpb.Fire) *fsmpb.Result {
	k := scheduleKey(f.Queue, f.Name)
	s := a.st.schedules[k]
	if s == nil || s.Next != f.Tick || f.Next <= f.Tick {
		return &fsmpb.Result{} // fired already (another leader), removed, or changed
	}
	ns := proto.Clone(s).(*fsmpb.Schedule)
	ns.Last, ns.Next = f.Tick, f.Next
	a.st.schedules[k] = ns
	if !f.Insert {
		return &fsmpb.Result{}
	}
	ns.Fired++
	res := a.modify(&fsmpb.Modify{Group: groupOf(s.Queue), Inserts: []*fsmpb.Insert{{
		Id: ScheduleTaskID(s.Name, f.Tick), Queue: s.Queue, Value: s.Value, Priority: s.Priority}}})
	if res.Failure != nil {
		// The id is taken (a task of this tick exists): the tick counts as
		// fired, nothing is inserted twice.
		return &fsmpb.Result{}
	}
	return res
}

// Schedules returns the schedules of queues starting with prefix, by queue
// then name.
func (m *Machine) Schedules(prefix string) []*fsmpb.Schedule {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []*fsmpb.Schedule
	for _, s := range m.st.schedules {
		if strings.HasPrefix(s.Queue, prefix) && m.st.readsGroup(groupOf(s.Queue)) {
			out = append(out, s)
		}
	}
	sortSchedules(out)
	return out
}

// DueSchedules returns the schedules whose next tick is at or before now.
func (m *Machine) DueSchedules(now int64) []*fsmpb.Schedule {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []*fsmpb.Schedule
	for _, s := range m.st.schedules {
		// A slot that is not served here (frozen for a move, too) fires
		// nowhere until its new shard serves it.
		if s.Next <= now && m.st.unserved(groupOf(s.Queue)) == nil {
			out = append(out, s)
		}
	}
	sortSchedules(out)
	return out
}

func sortSchedules(ss []*fsmpb.Schedule) {
	slices.SortFunc(ss, func(a, b *fsmpb.Schedule) int {
		if c := strings.Compare(a.Queue, b.Queue); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}
