package gcpercent

import (
	"os"
	"runtime/debug"
)

// Default is the growth target (GOGC) of a server whose environment sets
// none: a collection when the heap has grown by 200% of what the last one
// left live, against Go's 100%. Measured through a three-node cluster and
// a proxy (docs/performance-history.md, 2026-11-29 (afternoon)).
const Default = 200

// Set makes Default the growth target unless the GOGC environment
// variable is set (the runtime has applied it then), and returns the
// target in effect (-1: collections off) and whether GOGC chose it.
func Set() (percent int, fromEnv bool) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p, true
	}
	debug.SetGCPercent(Default)
	return Default, false
}
