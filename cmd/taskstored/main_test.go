package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestConfigMaxClockOffset(t *testing.T) {
	for _, tc := range []struct {
		offset  time.Duration
		wantErr string
	}{
		{500 * time.Millisecond, ""},
		{0, ""}, // the check off
		{-time.Second, "must not be negative"},
	} {
		f := &flags{id: "n1", dataDir: t.TempDir(), shards: 8, replicas: 3, timeoutScale: 1, maxClockOffset: tc.offset}
		cfg, err := f.config(slog.Default())
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("--max-clock-offset %v: err %v, want %q", tc.offset, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("--max-clock-offset %v: %v", tc.offset, err)
		}
		if cfg.Tuning.MaxClockOffset != tc.offset {
			t.Fatalf("--max-clock-offset %v reached the node as %v", tc.offset, cfg.Tuning.MaxClockOffset)
		}
	}
}
