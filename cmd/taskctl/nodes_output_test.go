package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// TestDiskFreeShowsAFullDisk: a node that measured a full disk shows 0B in
// DISK FREE, not the "-" of a node that did not answer.
func TestDiskFreeShowsAFullDisk(t *testing.T) {
	var out bytes.Buffer
	err := printNodes(&out, []*taskstorepb.NodeStatus{
		{Id: "full", DiskMeasured: true, DiskLow: true},
		{Id: "silent"},
		{Id: "old", DiskFreeBytes: 2 << 30},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"full": "0 B LOW", "silent": "-", "old": "2.0 GiB"}
	for _, line := range strings.Split(out.String(), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if w, ok := want[f[0]]; ok && !strings.Contains(line, " "+w+" ") {
			t.Errorf("%s: %q, want DISK FREE %q", f[0], line, w)
		}
	}
}
