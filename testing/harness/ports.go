package harness

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// Ports for processes that bind them later (taskstored children, memberlist)
// are picked outside the kernel's ephemeral range: a port from
// 127.0.0.1:0 is itself ephemeral, and between the pick and the child's
// bind, an outgoing connection of another node (a Raft dial, a gossip
// probe) may be given the same port, and the child then fails with "address
// already in use" (seen in CI). Ports below the range are never handed out
// for outgoing connections.
var picked struct {
	sync.Mutex
	ports map[int]bool // handed out by this test binary: never twice
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), 32768 when it cannot be read.
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n == 2 && lo > 2048 {
			low = lo
		}
	}
	return low
}

// freeGossipAddr finds a loopback port free for both TCP and UDP (gossip
// uses both), below the ephemeral range when it can.
func freeGossipAddr(t testing.TB) string {
	picked.Lock()
	defer picked.Unlock()
	if picked.ports == nil {
		picked.ports = map[int]bool{}
	}
	low := ephemeralLow()
	for range 200 {
		port := 10000 + rand.IntN(max(1, low-10000))
		if port >= low || picked.ports[port] {
			continue
		}
		if addr, ok := bindable(fmt.Sprintf("127.0.0.1:%d", port)); ok {
			picked.ports[port] = true
			return addr
		}
	}
	// Fall back to an ephemeral port (a range too small or all taken).
	for range 50 {
		if addr, ok := bindable("127.0.0.1:0"); ok {
			return addr
		}
	}
	t.Fatal("no free port for TCP and UDP")
	return ""
}

// bindable binds addr for TCP, then the same port for UDP, and releases
// both; it returns the address bound.
func bindable(addr string) (string, bool) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", false
	}
	addr = l.Addr().String()
	u, err := net.ListenPacket("udp", addr)
	l.Close()
	if err != nil {
		return "", false
	}
	u.Close()
	return addr, true
}
