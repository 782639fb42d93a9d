package main

// Reading a process's CPU time and bytes written from /proc, for the cost
// accounting (cost.go).
//
// CPU time is utime+stime from /proc/<pid>/stat, in clock ticks. The tick
// (sysconf(_SC_CLK_TCK), USER_HZ) is not available from Go without cgo,
// but the kernel hands it to every process in its auxiliary vector as
// AT_CLKTCK, which /proc/self/auxv shows: clkTck reads it there, and falls
// back to 100 (USER_HZ on every Linux architecture Go supports) when that
// cannot be read.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// procStat is what we read of /proc/<pid>/stat.
type procStat struct {
	ppid int
	// Clock ticks: user and system time of the process (all its threads,
	// living and exited), and of its children that it has waited for.
	utime, stime, cutime, cstime uint64
}

// ticks is the CPU time of the process and of its reaped children.
func (s procStat) ticks() uint64 { return s.utime + s.stime + s.cutime + s.cstime }

// parseProcStat parses the text of /proc/<pid>/stat (proc(5)). The command
// name (field 2) is in parentheses and may itself hold spaces and
// parentheses, so the fields are counted after the last ')'.
func parseProcStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("stat: no ')' after the command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field n of proc(5) is f[n-3].
	if len(f) < 17-3+1 {
		return procStat{}, fmt.Errorf("stat: %d fields after the command name, want at least 15", len(f))
	}
	var s procStat
	var err error
	if s.ppid, err = strconv.Atoi(f[4-3]); err != nil {
		return procStat{}, fmt.Errorf("stat: ppid: %w", err)
	}
	for n, dst := range map[int]*uint64{14: &s.utime, 15: &s.stime, 16: &s.cutime, 17: &s.cstime} {
		// cutime and cstime are signed in proc(5), never negative in practice.
		v, err := strconv.ParseInt(f[n-3], 10, 64)
		if err != nil || v < 0 {
			return procStat{}, fmt.Errorf("stat: field %d %q: not a tick count", n, f[n-3])
		}
		*dst = uint64(v)
	}
	return s, nil
}

// parseProcIO returns write_bytes of /proc/<pid>/io: the bytes the process
// (and the children it waited for) caused to be sent to storage.
func parseProcIO(b []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == "write_bytes" {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("io: no write_bytes")
}

// atClkTck is AT_CLKTCK, the auxiliary vector's entry for the clock tick.
const atClkTck = 17

// auxvValue finds key in an auxiliary vector as /proc/self/auxv holds it:
// pairs of native-endian words (type, value), ended by type 0.
func auxvValue(b []byte, key uint64) (uint64, bool) {
	w := strconv.IntSize / 8
	word := func(p []byte) uint64 {
		if w == 4 {
			return uint64(binary.NativeEndian.Uint32(p))
		}
		return binary.NativeEndian.Uint64(p)
	}
	for len(b) >= 2*w {
		k, v := word(b), word(b[w:])
		if k == 0 {
			break
		}
		if k == key {
			return v, true
		}
		b = b[2*w:]
	}
	return 0, false
}

// clkTck is the length of a /proc/<pid>/stat tick: ticks per second.
var clkTck = sync.OnceValue(func() float64 {
	if b, err := os.ReadFile("/proc/self/auxv"); err == nil {
		if v, ok := auxvValue(b, atClkTck); ok && v > 0 {
			return float64(v)
		}
	}
	return 100
})

// procSample is one reading of a process, or of a process tree.
type procSample struct {
	cpu        float64 // seconds
	cpuOK      bool
	writeBytes float64
	writeOK    bool
}

// readProc reads pid under proc (normally /proc).
func readProc(proc string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(b)
}

func readProcIO(proc string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "io"))
	if err != nil {
		return 0, err
	}
	return parseProcIO(b)
}

// procTree is root and every descendant of it that is alive, from the
// parent pid of every process under proc.
func procTree(proc string, root int) []int {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return []int{root}
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		s, err := readProc(proc, pid)
		if err != nil {
			continue // gone meanwhile
		}
		children[s.ppid] = append(children[s.ppid], pid)
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// sampleProc reads the CPU time and bytes written of pid, or with tree of
// pid and all its descendants. Each process counts with its reaped
// children (cutime, cstime; /proc/<pid>/io includes them too), so a child
// that exits and is waited for between two samples still counts, in its
// parent's figures. Processes that vanish while we read are skipped; pid
// itself must be readable for a figure to be OK.
func sampleProc(proc string, pid int, tree bool) procSample {
	pids := []int{pid}
	if tree {
		pids = procTree(proc, pid)
	}
	var ticks uint64
	var s procSample
	for i, p := range pids {
		st, err := readProc(proc, p)
		if err != nil {
			if i == 0 {
				break
			}
			continue
		}
		ticks += st.ticks()
		if i == 0 {
			s.cpuOK = true
		}
		wb, err := readProcIO(proc, p)
		if err != nil {
			if i == 0 {
				s.writeOK = false
			}
			continue
		}
		s.writeBytes += float64(wb)
		if i == 0 {
			s.writeOK = true
		}
	}
	s.cpu = float64(ticks) / clkTck()
	return s
}

// selfCPU is the CPU time taskbench itself has used, in seconds
// (getrusage: microseconds, finer than /proc's ticks).
func selfCPU() (float64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime), true
}
