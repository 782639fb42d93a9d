package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
)

var picked struct {
	sync.Mutex
	ports map[int]bool // handed out by this process: never twice
}

// lowest is where picks start: below it are well-known and registered
// service ports.
const lowest = 10000

// ephemeralLow is the first port of the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), 32768 when it cannot be read.
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n == 2 && lo > 2048 {
			return lo
		}
	}
	return 32768
}

// Addr returns a loopback address free a moment ago for TCP and UDP, below
// the ephemeral range when it can (an ephemeral one otherwise).
func Addr() (string, error) {
	picked.Lock()
	defer picked.Unlock()
	if picked.ports == nil {
		picked.ports = map[int]bool{}
	}
	if low := ephemeralLow(); low > lowest {
		for range 200 {
			port := lowest + rand.IntN(low-lowest)
			if picked.ports[port] {
				continue
			}
			if addr, ok := bindable(fmt.Sprintf("127.0.0.1:%d", port)); ok {
				picked.ports[port] = true
				return addr, nil
			}
		}
	}
	for range 50 {
		if addr, ok := bindable("127.0.0.1:0"); ok {
			return addr, nil
		}
	}
	return "", errors.New("no loopback port free for both TCP and UDP")
}

// Addrs returns n distinct addresses as Addr does.
func Addrs(n int) ([]string, error) {
	addrs := make([]string, n)
	for i := range addrs {
		var err error
		if addrs[i], err = Addr(); err != nil {
			return nil, err
		}
	}
	return addrs, nil
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
