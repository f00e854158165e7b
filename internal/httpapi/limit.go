package httpapi

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// LimitConns returns a listener for srv that keeps at most limit
// connections open at once, lets no one client address hold more than a
// quarter of them (perClient) anonymously, and always lets a new client
// in.
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
//     client's longest idle anonymous connection; if none of them is idle,
//     the new one is refused (closed at once).
//   - A new connection when limit are open closes the longest idle
//     connection of anyone, an anonymous one before a caller's. Only when
//     every connection is busy with a request does the new one wait in the
//     kernel's backlog for a slot; ReadTimeout and WriteTimeout bound how
//     long that can be.
//
// A connection is anonymous until a request on it is authorised
// (Authenticate); from then on it is its caller's, and does not count
// against its address's share. On one host every client is 127.0.0.1: a
// local process that hoards connections gets a quarter of the slots, and
// the caller beside it, such as the outbox sender, keeps its own.
//
// A connection whose request was answered without its body being read
// (closeUnreadBodies) only waits a moment for the rest of that body before
// it closes. It counts as idle, so that a client sending bodies a byte at
// a time holds no slot anyone needs.
//
// A health check, an orchestrator's or an operator's request thus gets in
// while a hostile client holds idle connections or trickles bodies. An idle connection closed
// this way costs its client a reconnect, which HTTP clients do on their
// own. limit <= 0 means no cap.
//
// It sets srv.ConnState, to learn which connections are idle, and
// srv.ConnContext, so that a request can tell the guard about its
// connection.
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
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, c)
	}
	return l
}

type guard struct {
	net.Listener
	max, perClient int

	mu       sync.Mutex
	open     map[*guardConn]bool
	byClient map[string]int // open anonymous connections by client address
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
	// authorised is true once a request on it named its caller.
	authorised bool
	// answered is true once a request was answered without its body
	// being read; the connection closes after it (see closeUnreadBodies).
	answered  bool
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
		victim := g.victim(client)
		if victim == nil {
			g.mu.Unlock()
			_ = c.Close()
			return nil, nil
		}
		g.evict(victim)
	}
	for len(g.open) >= g.max {
		if victim := g.victim(""); victim != nil {
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

// victim is the idle connection to close to make room: the longest idle
// of client's anonymous ones, or with client "", of anyone's, an anonymous
// one before a caller's. It is nil when every candidate is busy. Callers
// hold g.mu.
func (g *guard) victim(client string) *guardConn {
	var victim *guardConn
	for c := range g.open {
		if c.busy || client != "" && (c.client != client || c.authorised) {
			continue
		}
		if victim == nil || before(c, victim) {
			victim = c
		}
	}
	return victim
}

// before reports whether a is closed before b to make room.
func before(a, b *guardConn) bool {
	if a.authorised != b.authorised {
		return b.authorised
	}
	return a.idleSince.Before(b.idleSince)
}

// evict forgets c at once, so that its slot counts as free, and ends it.
// Callers hold g.mu.
func (g *guard) evict(c *guardConn) {
	g.forget(c)
	if c.answered {
		// Its answer may not be sent yet: stop the wait for its body,
		// and net/http closes it once the answer is out.
		_ = c.SetReadDeadline(time.Now())
		return
	}
	go func() { _ = c.Close() }() // without holding g.mu
}

// forget removes c from the counts, once. Callers hold g.mu.
func (g *guard) forget(c *guardConn) {
	if !g.open[c] {
		return
	}
	delete(g.open, c)
	if !c.authorised {
		g.leaveShare(c.client)
	}
	g.wake()
}

// leaveShare counts one anonymous connection of client less. Callers hold
// g.mu.
func (g *guard) leaveShare(client string) {
	if g.byClient[client]--; g.byClient[client] == 0 {
		delete(g.byClient, client)
	}
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

// connKey is the context key of the connection a request came on.
type connKey struct{}

// markAuthorised tells the guard of r's connection that a request on it
// named its caller: the connection is the caller's now.
func markAuthorised(r *http.Request) {
	withConn(r, func(c *guardConn) {
		if c.g.open[c] && !c.authorised {
			c.authorised = true
			c.g.leaveShare(c.client)
		}
	})
}

// markAnswered tells the guard of r's connection that r was answered
// without its body being read: the connection only waits for the rest of
// the body, and then closes.
func markAnswered(r *http.Request) {
	withConn(r, func(c *guardConn) {
		c.answered, c.busy, c.idleSince = true, false, time.Now()
		c.g.wake() // an Accept waiting for a slot may take this one
	})
}

// withConn runs f on the guard's record of r's connection, holding the
// guard's lock; it does nothing when no guard keeps the connection.
func withConn(r *http.Request, f func(c *guardConn)) {
	c, ok := r.Context().Value(connKey{}).(*guardConn)
	if !ok {
		return
	}
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	f(c)
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
