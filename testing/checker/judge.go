package checker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Judge runs every checker on in and logs the scenario's one SUMMARY line,
//
//	SUMMARY <name>: <Report.Summary()> terms=N final-tasks=N check=D total=D [notes...]
//
// (total counts from start). On a violation it fails t, names each
// violation (the first 50) and writes history.json and final.json to
// t.ArtifactDir() (kept with go test -artifacts). Notes are appended to the
// line as they are, e.g. "replicas=skipped".
func Judge(t *testing.T, name string, in Input, terms int, start time.Time, notes ...string) *Report {
	t.Helper()
	checkStart := time.Now()
	report := All(in)
	tasks := 0
	if in.Final != nil {
		tasks = len(in.Final.Tasks)
	}
	line := fmt.Sprintf("SUMMARY %s: %s terms=%d final-tasks=%d check=%v total=%v", name, report.Summary(), terms, tasks,
		time.Since(checkStart).Round(time.Millisecond), time.Since(start).Round(time.Second))
	if len(notes) > 0 {
		line += " " + strings.Join(notes, " ")
	}
	t.Log(line)
	if report.OK() {
		return report
	}
	dir := t.ArtifactDir()
	if f, err := os.Create(filepath.Join(dir, "history.json")); err == nil {
		in.History.WriteJSON(f)
		f.Close()
	}
	if data, err := json.Marshal(in.Final); err == nil {
		os.WriteFile(filepath.Join(dir, "final.json"), data, 0o644)
	}
	t.Logf("history and final state in %s (kept with go test -artifacts)", dir)
	for i, v := range report.Violations {
		if i == 50 {
			t.Errorf("... and %d more", len(report.Violations)-50)
			break
		}
		t.Errorf("violation: %s", v)
	}
	return report
}
