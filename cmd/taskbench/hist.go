package main

import (
	"math"
	"slices"
	"time"
)

// hist records latencies exactly (one int64 per sample) and answers
// percentiles by sorting. A run of 30 s at 50k ops/s is 1.5M samples, 12 MB:
// exactness is worth that here. Not safe for concurrent use: every worker
// keeps its own and they are merged at the end.
type hist struct {
	samples []time.Duration
	sorted  bool
}

func (h *hist) record(d time.Duration) {
	h.samples = append(h.samples, d)
	h.sorted = false
}

func (h *hist) merge(o *hist) {
	if o == nil || len(o.samples) == 0 {
		return
	}
	h.samples = append(h.samples, o.samples...)
	h.sorted = false
}

func (h *hist) count() int { return len(h.samples) }

func (h *hist) sort() {
	if !h.sorted {
		slices.Sort(h.samples)
		h.sorted = true
	}
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100): the
// smallest sample with at least p% of the samples at or below it. Zero when
// empty.
func (h *hist) percentile(p float64) time.Duration {
	n := len(h.samples)
	if n == 0 {
		return 0
	}
	h.sort()
	// The epsilon keeps float error (99.9/100*1000 = 999.0000000000001)
	// from pushing the rank up by one.
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	rank = min(max(rank, 1), n)
	return h.samples[rank-1]
}

func (h *hist) max() time.Duration {
	if len(h.samples) == 0 {
		return 0
	}
	h.sort()
	return h.samples[len(h.samples)-1]
}

func (h *hist) mean() time.Duration {
	if len(h.samples) == 0 {
		return 0
	}
	var sum float64
	for _, s := range h.samples {
		sum += float64(s)
	}
	return time.Duration(sum / float64(len(h.samples)))
}

// latencySummary is what the report shows of a histogram, in milliseconds.
type latencySummary struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func (h *hist) summary() latencySummary {
	return latencySummary{
		Count: h.count(), Mean: ms(h.mean()),
		P50: ms(h.percentile(50)), P90: ms(h.percentile(90)), P99: ms(h.percentile(99)),
		P999: ms(h.percentile(99.9)), Max: ms(h.max()),
	}
}
