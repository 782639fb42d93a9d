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
		f := &flags{id: "n1", dataDir: t.TempDir(), shards: 0, replicas: 3, timeoutScale: 1, maxClockOffset: tc.offset}
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

func TestConfigMinFreeDisk(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr string
	}{
		{"256MiB", 256 << 20, ""},
		{"1GiB", 1 << 30, ""},
		{"4096", 4096, ""},
		{"512 MB", 512 << 20, ""},
		{"0", 0, ""}, // the check off
		{"-1", 0, "want a size"},
		{"lots", 0, "want a size"},
		{"99999999999GiB", 0, "too large"},
	} {
		f := &flags{id: "n1", dataDir: t.TempDir(), shards: 0, replicas: 3, timeoutScale: 1, minFreeDisk: tc.in}
		cfg, err := f.config(slog.Default())
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("--min-free-disk %q: err %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("--min-free-disk %q: %v", tc.in, err)
		}
		if cfg.Tuning.MinFreeDisk != tc.want {
			t.Fatalf("--min-free-disk %q reached the node as %d, want %d", tc.in, cfg.Tuning.MinFreeDisk, tc.want)
		}
	}
}

func TestConfigState(t *testing.T) {
	for _, tc := range []struct {
		state, want, wantErr string
	}{
		{"", "", ""},
		{"disk", "disk", ""},
		{"memory", "memory", ""},
		{"ram", "", `--state "ram": want disk or memory`},
	} {
		f := &flags{id: "n1", dataDir: t.TempDir(), replicas: 3, timeoutScale: 1, stateStore: tc.state}
		cfg, err := f.config(slog.Default())
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("--state %q: err %v, want %q", tc.state, err, tc.wantErr)
			}
			continue
		}
		if err != nil || cfg.StateStore != tc.want {
			t.Fatalf("--state %q: %v, reached the node as %q", tc.state, err, cfg.StateStore)
		}
	}
}

// TestConfigListen: without --listen a node listens at its own
// --initial-cluster entry, the address every other node dials and it
// advertises; only a node with no entry falls back to 127.0.0.1:7101.
func TestConfigListen(t *testing.T) {
	const initial = "n1=127.0.0.1:8101,n2=127.0.0.1:8102"
	for _, tc := range []struct {
		id, listen, initial, want string
	}{
		{"n2", "", initial, "127.0.0.1:8102"},
		{"n1", "", initial, "127.0.0.1:8101"},
		{"n2", "0.0.0.0:9000", initial, "0.0.0.0:9000"}, // --listen given
		{"n3", "", initial, "127.0.0.1:7101"},           // joining: no entry
		{"n1", "", "", "127.0.0.1:7101"},
	} {
		f := &flags{id: tc.id, dataDir: t.TempDir(), listen: tc.listen, initialCluster: tc.initial, replicas: 3, timeoutScale: 1}
		cfg, err := f.config(slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ListenAddr != tc.want {
			t.Errorf("--id %s --listen %q --initial-cluster %q: listens at %q, want %q", tc.id, tc.listen, tc.initial, cfg.ListenAddr, tc.want)
		}
	}
}
