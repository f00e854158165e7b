package httpapi

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// LimitConns returns a listener for srv that keeps at most limit
// connections open at once, and at most a quarter of them (perClient) from
// any one client address, while always letting a new client in.
//
// Each open connection costs a goroutine, buffers and a file descriptor;
// without a cap a flood of connections could use up the descriptors the
// process needs for its database. But a plain cap is itself a way to shut
// everyone out: a client that opens a connection per slot, sends one
// request on each and then keeps them idle (keep-alive) holds every slot
// for IdleTimeout, and a request every few seconds keeps it that way. So a
// connection that is idle (between requests, or not yet sent one) is the
// first to go:
//
//   - A new connection from a client at its perClient share closes that
//     client's longest idle connection; if none of them is idle, the new
//     one is refused (closed at once).
//   - A new connection when limit are open closes the longest idle
//     connection of anyone. Only when every connection is busy with a
//     request does the new one wait in the kernel's backlog for a slot;
//     ReadTimeout and WriteTimeout bound how long that can be.
//
// A health check, an orchestrator's or an operator's request thus gets in
// while a hostile client holds idle connections. An idle connection closed
// this way costs its client a reconnect, which HTTP clients do on their
// own. limit <= 0 means no cap.
//
// It sets srv.ConnState, to learn which connections are idle.
func LimitConns(srv *http.Server, ln net.Listener, limit int) net.Listener {
	if limit <= 0 {
		return ln
	}
	l := &guard{
		Listener: ln, max: limit, perClient: max(limit/4, 1),
		open: map[*guardConn]bool{}, byClient: map[string]int{},
		freed: make(chan struct{}, 1), done: make(chan struct{}),
	}
	srv.ConnState = l.track
	return l
}

type guard struct {
	net.Listener
	max, perClient int

	mu       sync.Mutex
	open     map[*guardConn]bool
	byClient map[string]int // open connections by client address
	// freed gets a signal when a connection closes or goes idle; done
	// closes with the listener.
	freed     chan struct{}
	closeOnce sync.Once
	done      chan struct{}
}

// guardConn is one accepted connection and what the guard knows of it.
type guardConn struct {
	net.Conn
	g      *guard
	client string
	// busy is true while the server handles a request on it; idleSince
	// is when it last went idle (or was accepted).
	busy      bool
	idleSince time.Time
	closeOnce sync.Once
}

func (g *guard) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		gc, err := g.admit(c)
		if err != nil {
			return nil, err
		}
		if gc != nil {
			return gc, nil
		}
	}
}

// admit makes room for c, or refuses it (nil, nil).
func (g *guard) admit(c net.Conn) (*guardConn, error) {
	client := clientOf(c.RemoteAddr())
	g.mu.Lock()
	if g.byClient[client] >= g.perClient {
		victim := g.longestIdle(client)
		if victim == nil {
			g.mu.Unlock()
			_ = c.Close()
			return nil, nil
		}
		g.evict(victim)
	}
	for len(g.open) >= g.max {
		if victim := g.longestIdle(""); victim != nil {
			g.evict(victim)
			continue
		}
		g.mu.Unlock()
		select {
		case <-g.freed:
		case <-g.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
		g.mu.Lock()
	}
	gc := &guardConn{Conn: c, g: g, client: client, idleSince: time.Now()}
	g.open[gc] = true
	g.byClient[client]++
	g.mu.Unlock()
	return gc, nil
}

// longestIdle is the connection idle for longest, of client ("" for
// anyone's); nil when every one is busy. Callers hold g.mu.
func (g *guard) longestIdle(client string) *guardConn {
	var victim *guardConn
	for c := range g.open {
		if c.busy || client != "" && c.client != client {
			continue
		}
		if victim == nil || c.idleSince.Before(victim.idleSince) {
			victim = c
		}
	}
	return victim
}

// evict forgets c at once, so that its slot counts as free, and closes it
// without holding g.mu. Callers hold g.mu.
func (g *guard) evict(c *guardConn) {
	g.forget(c)
	go func() { _ = c.Close() }()
}

// forget removes c from the counts, once. Callers hold g.mu.
func (g *guard) forget(c *guardConn) {
	if !g.open[c] {
		return
	}
	delete(g.open, c)
	if g.byClient[c.client]--; g.byClient[c.client] == 0 {
		delete(g.byClient, c.client)
	}
	g.wake()
}

// wake tells an Accept waiting for a slot that one may have freed: a
// connection closed, or went idle. Callers hold g.mu.
func (g *guard) wake() {
	select {
	case g.freed <- struct{}{}:
	default:
	}
}

// track follows each connection's state, as net/http reports it.
func (g *guard) track(c net.Conn, state http.ConnState) {
	gc, ok := c.(*guardConn)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch state {
	case http.StateActive:
		gc.busy = true
	case http.StateIdle:
		gc.busy, gc.idleSince = false, time.Now()
		g.wake() // an Accept waiting for a slot may take this one
	case http.StateHijacked, http.StateClosed:
		g.forget(gc)
	}
}

// Close also ends an Accept waiting for a slot, so that a server at its
// cap still shuts down at once.
func (g *guard) Close() error {
	err := g.Listener.Close()
	g.closeOnce.Do(func() { close(g.done) })
	return err
}

func (c *guardConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		c.g.mu.Lock()
		c.g.forget(c)
		c.g.mu.Unlock()
	})
	return err
}

// CloseWrite half-closes a TCP connection: net/http half-closes one after
// answering 431 so that the client reads the answer before the connection
// is reset, and only a connection that has CloseWrite gets that.
func (c *guardConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// clientOf is the client's address without its port: the unit the
// per-client share counts.
func clientOf(addr net.Addr) string {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}
