package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/e1158ecb/taskstore/internal/bytesize"
)

// machineMemoryShare is the part of the machine's memory a node takes as
// its limit when no cgroup bounds it, in percent: it shares the machine
// with the page cache its Raft log and state engine live in.
const machineMemoryShare = 50

// goMemoryShare is the part of the memory limit given to Go's garbage
// collector as its soft limit, in percent: the rest is what the runtime
// does not count (goroutine stacks beyond the heap's, the binary's own
// pages, the page cache charged to the container).
const goMemoryShare = 90

// unlimitedCgroup: a cgroup v1 limit at or above this is "no limit" (the
// kernel reports the largest page-aligned int64).
const unlimitedCgroup = 1 << 60

// detectMemoryLimit is the memory a node may use when --memory-limit is not
// given: the tightest limit of the cgroups the process runs in (v2
// memory.max, v1 memory.limit_in_bytes; a container's --memory), else
// machineMemoryShare of the machine's memory. root is "/" (tests give
// another). 0: nothing known.
func detectMemoryLimit(root string) (limit int64, source string) {
	if l, path := cgroupLimit(root); l > 0 {
		return l, path
	}
	if total := memTotal(root); total > 0 {
		return total * machineMemoryShare / 100, fmt.Sprintf("%d%% of the machine's %s", machineMemoryShare, bytesize.Format(uint64(total)))
	}
	return 0, ""
}

// cgroupLimit is the smallest memory limit of the process's cgroup and its
// ancestors, v2 or v1, and the file it came from; 0: none.
func cgroupLimit(root string) (int64, string) {
	var best int64
	var from string
	consider := func(file string) {
		b, err := os.ReadFile(file)
		if err != nil {
			return
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 || v >= unlimitedCgroup {
			return
		}
		if best == 0 || v < best {
			best, from = v, file
		}
	}
	// A container sees its own cgroup at the mount's root; on a host the
	// process's cgroup path (/proc/self/cgroup) leads to it, and a parent
	// (a systemd slice) may be tighter.
	consider(filepath.Join(root, "sys/fs/cgroup/memory.max"))
	consider(filepath.Join(root, "sys/fs/cgroup/memory/memory.limit_in_bytes"))
	f, err := os.Open(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return best, from
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir, file = filepath.Join(root, "sys/fs/cgroup"), "memory.max"
		case strings.Contains(","+parts[1]+",", ",memory,"):
			dir, file = filepath.Join(root, "sys/fs/cgroup/memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		for p := filepath.Clean("/" + parts[2]); p != "/"; p = filepath.Dir(p) {
			consider(filepath.Join(dir, p, file))
		}
	}
	return best, from
}

// memTotal is the machine's memory from /proc/meminfo, or 0.
func memTotal(root string) int64 {
	b, err := os.ReadFile(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// resolveMemoryLimit turns --memory-limit into bytes: "" detects it,
// "0" or "none" means no limit.
func resolveMemoryLimit(flag string) (limit int64, source string, err error) {
	switch strings.TrimSpace(flag) {
	case "":
		limit, source = detectMemoryLimit("/")
		return limit, source, nil
	case "0", "none":
		return 0, "--memory-limit", nil
	}
	limit, err = parseBytes(flag)
	if err != nil {
		return 0, "", fmt.Errorf("--memory-limit %q: %w", flag, err)
	}
	if limit < 32<<20 {
		return 0, "", fmt.Errorf("--memory-limit %q: at least 32MiB (a node's own buffers take tens of MiB), or 0 for no limit", flag)
	}
	return limit, "--memory-limit", nil
}

// setGoMemoryLimit gives Go's garbage collector goMemoryShare of the node's
// limit as its soft limit, so that the heap is collected harder as it nears
// the limit instead of growing past it; GOMEMLIMIT, when set, wins.
func setGoMemoryLimit(limit int64) (soft int64, fromEnv bool) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1), true
	}
	if limit <= 0 {
		return debug.SetMemoryLimit(-1), false
	}
	soft = limit / 100 * goMemoryShare
	debug.SetMemoryLimit(soft)
	return soft, false
}
