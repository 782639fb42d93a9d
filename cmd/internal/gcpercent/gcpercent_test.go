package gcpercent

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestSetAppliesDefaultUnlessGOGC: without GOGC (or with an empty one)
// the collector runs at Default; with GOGC set, Set leaves the runtime's
// setting alone and reports it.
func TestSetAppliesDefaultUnlessGOGC(t *testing.T) {
	old := debug.SetGCPercent(150)
	t.Cleanup(func() { debug.SetGCPercent(old) })

	// The runtime reads GOGC at start; here the target is already 150.
	t.Setenv("GOGC", "150")
	if p, fromEnv := Set(); !fromEnv || p != 150 {
		t.Errorf("with GOGC=150: Set() = %d, %v; want 150, true", p, fromEnv)
	}
	if got := Current(); got != 150 {
		t.Errorf("with GOGC=150: Set changed the target to %d", got)
	}

	debug.SetGCPercent(-1)
	t.Setenv("GOGC", "off")
	if p, fromEnv := Set(); !fromEnv || p != -1 {
		t.Errorf("with GOGC=off: Set() = %d, %v; want -1, true", p, fromEnv)
	}
	debug.SetGCPercent(150)

	for _, env := range []string{"unset", ""} {
		if env == "unset" {
			unsetenv(t, "GOGC")
		} else {
			t.Setenv("GOGC", env)
		}
		if p, fromEnv := Set(); fromEnv || p != Default {
			t.Errorf("GOGC %q: Set() = %d, %v; want %d, false", env, p, fromEnv, Default)
		}
		if got := Current(); got != Default {
			t.Errorf("GOGC %q: the target is %d, want %d", env, got, Default)
		}
		debug.SetGCPercent(150)
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
