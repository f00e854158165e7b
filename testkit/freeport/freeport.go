// Package freeport picks loopback ports for servers that tests and the
// bench start, then pass the address to by configuration.
//
// The usual trick, listening on port 0 and closing the listener, leaves a
// window in which the port is free for anyone. The kernel hands ports from
// that same ephemeral range to every outgoing connection (to PostgreSQL,
// between services), and to the next listen on port 0, so a server started
// a moment later can meet "address already in use". Ports here come from
// below the ephemeral range, which outgoing connections never use, and
// each is handed out once per process.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the bottom of the ports handed out: clear of the well-known
// and most registered service ports.
const lowest = 10000

var (
	mu         sync.Mutex
	next       int // the next port to try; 0 before the first call
	start, end int // [start, end): below the ephemeral range
)

// Addr returns "127.0.0.1:port" for a port that nothing listened on a
// moment ago and that this process has not handed out before.
func Addr() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if next == 0 {
		start, end = lowest, ephemeralLow()
		if end-start < 1000 {
			return "", fmt.Errorf("free port: the ephemeral range starts at %d, leaving no room below it", end)
		}
		// A random start, so that test binaries running side by side
		// rarely try the same ports.
		next = start + rand.IntN(end-start)
	}
	for range end - start {
		port := next
		next++
		if next == end {
			next = start
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // taken by a server already
		}
		addr := ln.Addr().String()
		if err := ln.Close(); err != nil {
			return "", fmt.Errorf("free port: %w", err)
		}
		return addr, nil
	}
	return "", errors.New("free port: every port below the ephemeral range is taken")
}

// Block returns the first of n consecutive loopback ports that nothing
// listened on a moment ago, for a program that takes one base port and
// opens the ones above it (make run's RUN_PORT_BASE). Like Addr's, they are
// handed out once per process.
func Block(n int) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	if next == 0 {
		start, end = lowest, ephemeralLow()
		next = start + rand.IntN(end-start)
	}
	for range (end - start) / n {
		base := next
		if base+n > end {
			base = start
		}
		next = base + n
		free := true
		for port := base; port < base+n && free; port++ {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				free = false
				continue
			}
			free = ln.Close() == nil
		}
		if free {
			return base, nil
		}
	}
	return 0, fmt.Errorf("free port: no %d consecutive free ports below the ephemeral range", n)
}

// ephemeralLow is where the kernel's range for outgoing connections
// starts: Linux says in /proc; elsewhere, the IANA range's start.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 49152
}
