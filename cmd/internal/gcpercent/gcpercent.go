package gcpercent

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
)

// Default is the growth target (GOGC) of a server whose environment sets
// none: a collection when the heap has grown by 200% of what the last one
// left live, against Go's 100%. Measured through a three-node cluster and
// a proxy (docs/performance-history.md, 2026-11-29 (afternoon)).
const Default = 200

// Set makes Default the growth target unless the GOGC environment
// variable is set to something (the runtime has applied it then: a
// number, off, or 100 for what it cannot read), and returns the target in
// effect (-1: collections off) and whether GOGC chose it. An empty GOGC
// counts as unset, as an empty GOMEMLIMIT does for taskstored.
func Set() (percent int, fromEnv bool) {
	if os.Getenv("GOGC") != "" {
		return Current(), true
	}
	debug.SetGCPercent(Default)
	return Default, false
}

// Current reads the growth target in effect without changing it (-1:
// collections off; the runtime reports GOGC=0 as off too, so it reads as
// -1 as well).
func Current() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	p := s[0].Value.Uint64()
	if p == 0 {
		return -1 // off (or GOGC=0) reads as 0 here
	}
	return int(p)
}
