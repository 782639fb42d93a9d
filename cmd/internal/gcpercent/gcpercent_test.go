package gcpercent

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestSetAppliesDefaultUnlessGOGC: without GOGC the collector runs at
// Default; with GOGC set, Set leaves the runtime's setting alone and
// reports it.
func TestSetAppliesDefaultUnlessGOGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })

	t.Setenv("GOGC", "100") // read at start by the runtime; here the target is 100 already
	if p, fromEnv := Set(); !fromEnv || p != 100 {
		t.Errorf("with GOGC set: Set() = %d, %v; want the runtime's 100, true", p, fromEnv)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC set: Set changed the target to %d", got)
	}

	unsetenv(t, "GOGC")
	if p, fromEnv := Set(); fromEnv || p != Default {
		t.Errorf("without GOGC: Set() = %d, %v; want %d, false", p, fromEnv, Default)
	}
	if got := debug.SetGCPercent(100); got != Default {
		t.Errorf("without GOGC: the target is %d, want %d", got, Default)
	}
}

// unsetenv removes key for the rest of the test (t.Setenv only sets).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	old, had := os.LookupEnv(key)
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if had {
			os.Setenv(key, old)
		} else {
			os.Unsetenv(key)
		}
	})
}
