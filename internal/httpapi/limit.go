package httpapi

import (
	"net"
	"sync"
)

// LimitListener returns a listener that keeps at most n connections open
// at once. Past n, Accept waits until one of them closes; the new
// connection waits in the kernel's backlog meanwhile, so its client sees a
// slow first answer rather than a refusal. Each open connection costs a
// goroutine, buffers and a file descriptor; without a cap a flood of
// connections can use up the descriptors the process needs for its own
// database connections. n <= 0 means no cap.
//
// It is golang.org/x/net/netutil.LimitListener, plus CloseWrite: net/http
// half-closes a connection after answering 431 so that the client reads
// the answer before the connection is reset, and only a connection that
// has CloseWrite gets that.
func LimitListener(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	slots     chan struct{}
	closeOnce sync.Once
	done      chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close also ends an Accept waiting for a slot, so that a server at its
// cap still shuts down at once.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

type limitConn struct {
	net.Conn
	releaseOnce sync.Once
	release     func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.releaseOnce.Do(c.release)
	return err
}

// CloseWrite half-closes a TCP connection (see LimitListener).
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
