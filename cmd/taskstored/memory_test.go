package main

import (
	"os"
	"path/filepath"
	"testing"
)

// writeFiles creates files under root.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDetectMemoryLimit(t *testing.T) {
	meminfo := "MemTotal:        8000000 kB\nMemFree:         100 kB\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"v2 container", map[string]string{"sys/fs/cgroup/memory.max": "335544320\n", "proc/self/cgroup": "0::/\n", "proc/meminfo": meminfo}, 335544320},
		{"v2 max is no limit", map[string]string{"sys/fs/cgroup/memory.max": "max\n", "proc/self/cgroup": "0::/\n", "proc/meminfo": meminfo}, 8000000 << 10 / 2},
		{"v2 a parent slice is tighter", map[string]string{
			"proc/self/cgroup": "0::/system.slice/taskstored.service\n",
			"sys/fs/cgroup/system.slice/taskstored.service/memory.max": "max\n",
			"sys/fs/cgroup/system.slice/memory.max":                    "1073741824\n",
			"proc/meminfo":                                             meminfo}, 1 << 30},
		{"v1 container", map[string]string{"sys/fs/cgroup/memory/memory.limit_in_bytes": "335544320\n",
			"proc/self/cgroup": "4:memory:/docker/abc\n0::/\n", "proc/meminfo": meminfo}, 335544320},
		{"v1 unlimited", map[string]string{"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			"proc/self/cgroup": "4:memory:/\n", "proc/meminfo": meminfo}, 8000000 << 10 / 2},
		{"nothing known", map[string]string{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, tc.files)
			got, source := detectMemoryLimit(root)
			if got != tc.want {
				t.Fatalf("limit %d (from %q), want %d", got, source, tc.want)
			}
		})
	}
}

func TestResolveMemoryLimit(t *testing.T) {
	for flag, want := range map[string]int64{"0": 0, "none": 0, "320MiB": 320 << 20, "2GiB": 2 << 30} {
		got, _, err := resolveMemoryLimit(flag)
		if err != nil || got != want {
			t.Errorf("--memory-limit %s: %d, %v; want %d", flag, got, err, want)
		}
	}
	for _, flag := range []string{"lots", "-1", "1MiB"} {
		if _, _, err := resolveMemoryLimit(flag); err == nil {
			t.Errorf("--memory-limit %s: accepted", flag)
		}
	}
}
