package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// port is one address the dev cluster listens on.
type port struct {
	addr, what string
	udp        bool // also UDP (gossip)
}

// checkPorts tries each address before anything starts, so that a second
// `make run` says at once which port is taken, and by what when this
// machine can tell, instead of printing the cluster's banner and failing
// midway.
func checkPorts(ports []port) error {
	for _, p := range ports {
		udp := false
		l, err := net.Listen("tcp", p.addr)
		if err == nil {
			l.Close()
			if !p.udp {
				continue
			}
			var pc net.PacketConn
			if pc, err = net.ListenPacket("udp", p.addr); err == nil {
				pc.Close()
				continue
			}
			udp = true
		}
		owner := ""
		if by := portOwner(p.addr, udp); by != "" {
			owner = " by " + by
		}
		return fmt.Errorf("%s (%s) is in use%s: is another `make run` or taskstored running? Stop it first: %w", p.addr, p.what, owner, err)
	}
	return nil
}

// portOwner names the process listening on addr's port ("pid 123
// (taskstored)"), from /proc on Linux; "" where it cannot tell.
func portOwner(addr string, udp bool) string {
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	want, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return ""
	}
	tables, state := []string{"/proc/net/tcp", "/proc/net/tcp6"}, "0A" // LISTEN
	if udp {
		tables, state = []string{"/proc/net/udp", "/proc/net/udp6"}, "07"
	}
	inodes := map[string]bool{}
	for _, table := range tables {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != state {
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && p == want {
				inodes["socket:["+fields[9]+"]"] = true
			}
		}
		f.Close()
	}
	if len(inodes) == 0 {
		return ""
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			pid := strings.Split(fd, "/")[2]
			comm, _ := os.ReadFile(filepath.Join("/proc", pid, "comm"))
			return fmt.Sprintf("pid %s (%s)", pid, strings.TrimSpace(string(comm)))
		}
	}
	return ""
}
