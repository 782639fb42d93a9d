package rpc

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// MaxGroupSeries caps how many consistency groups get their own series; the
// rest are counted under group="other".
const MaxGroupSeries = 500

// apiMetrics count what the API edge did. They are counted on the node that
// served the request (the shard leader), so summing over nodes gives the
// cluster's totals. A retry answered from the exactly-once memory counts
// again.
type apiMetrics struct {
	inserted, claimed, committed, deleted *prometheus.CounterVec
	leaseExpired                          *prometheus.CounterVec
	refused                               *prometheus.CounterVec
	groups                                labelCap
}

func newAPIMetrics(reg prometheus.Registerer) *apiMetrics {
	counter := func(name, help string, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	}
	m := &apiMetrics{
		inserted:  counter("taskstore_tasks_inserted_total", "Tasks inserted (coalesced if_absent inserts not counted).", "group"),
		claimed:   counter("taskstore_tasks_claimed_total", "Tasks claimed.", "group"),
		committed: counter("taskstore_tasks_committed_total", "Tasks committed: deleted, or changed without keeping the claim.", "group"),
		deleted:   counter("taskstore_tasks_deleted_total", "Tasks deleted by transactions.", "group"),
		leaseExpired: counter("taskstore_lease_expirations_total",
			"Tasks claimed again after their previous holder's lease ran out without a commit or release.", "group"),
		refused: counter("taskstore_modify_refused_total", "Offending references in refused transactions, by category; MEMORY_FULL counts transactions refused because their shard's tasks reached its memory budget (--memory-limit).", "category"),
		groups:  labelCap{max: MaxGroupSeries, seen: map[string]bool{}},
	}
	if reg != nil {
		reg.MustRegister(m.inserted, m.claimed, m.committed, m.deleted, m.leaseExpired, m.refused)
	}
	return m
}

func (m *apiMetrics) modified(group string, req *taskstorepb.ModifyRequest, res *fsmpb.ModifyResult) {
	g := m.groups.label(group)
	m.inserted.WithLabelValues(g).Add(float64(len(req.Inserts) - len(res.GetCoalesced())))
	m.deleted.WithLabelValues(g).Add(float64(len(req.Deletes)))
	committed := len(req.Deletes)
	for _, c := range req.Changes {
		if !c.KeepClaim {
			committed++
		}
	}
	m.committed.WithLabelValues(g).Add(float64(committed))
}

func (m *apiMetrics) refusal(f *fsmpb.Failure) {
	if fsm.KindOf(f) == fsmpb.Failure_MEMORY_FULL {
		m.refused.WithLabelValues("MEMORY_FULL").Inc()
	}
	for _, e := range f.Errors {
		m.refused.WithLabelValues(taskstorepb.RefError_Category(e.Category).String()).Inc()
	}
}

// labelCap passes through the first max values of a label and folds the
// rest into "other", so series stay bounded however many groups exist.
type labelCap struct {
	max  int
	mu   sync.Mutex // guards seen
	seen map[string]bool
}

func (c *labelCap) label(v string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[v] {
		return v
	}
	if len(c.seen) >= c.max {
		return "other"
	}
	c.seen[v] = true
	return v
}
