package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"
)

// profileTarget is one process of a local cluster whose /debug/pprof
// taskbench reads with --profile.
type profileTarget struct {
	name string // n1, n2, ... or proxy
	http string // its --http address
}

// startProfiles starts fetching, from every target, a CPU profile and an
// allocation profile (a delta: only what was allocated meanwhile) over d,
// the measured interval, into dir as NAME-cpu.pprof and NAME-allocs.pprof.
// taskbench profiles its own CPU too (bench-cpu.pprof): the load
// generator is a Go client of the cluster, and its CPU per task shares the
// machine with the rest. The returned function waits for them and reports
// what failed.
func startProfiles(ctx context.Context, dir string, targets []profileTarget, d time.Duration) func() error {
	secs := max(1, int(math.Round(d.Seconds())))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return func() error { return fmt.Errorf("--profile: %w", err) }
	}
	self, err := os.Create(filepath.Join(dir, "bench-cpu.pprof"))
	if err == nil {
		if err = pprof.StartCPUProfile(self); err != nil {
			self.Close()
			self = nil
		}
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("--profile: bench cpu: %w", err))
	}
	client := &http.Client{Timeout: d + 30*time.Second}
	for _, t := range targets {
		for kind, path := range map[string]string{"cpu": "profile", "allocs": "allocs"} {
			wg.Go(func() {
				url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", t.http, path, secs)
				file := filepath.Join(dir, t.name+"-"+kind+".pprof")
				if err := fetchTo(ctx, client, url, file); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("--profile: %s %s: %w", t.name, kind, err))
					mu.Unlock()
				}
			})
		}
	}
	return func() error {
		if self != nil {
			pprof.StopCPUProfile()
			if err := self.Close(); err != nil {
				errs = append(errs, fmt.Errorf("--profile: bench cpu: %w", err))
			}
		}
		wg.Wait()
		return errors.Join(errs...)
	}
}

// fetchTo writes the body of a successful GET of url to file.
func fetchTo(ctx context.Context, c *http.Client, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, msg)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
