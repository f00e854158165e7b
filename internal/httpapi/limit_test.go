package httpapi

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/apitest"
)

const get = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

// serveLimited serves h on a loopback port with LimitConns(limit) until
// the test ends, and returns its address.
func serveLimited(t *testing.T, h http.Handler, limit int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(h)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, slog.New(slog.DiscardHandler), srv, LimitConns(srv, ln, limit), time.Second)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("the server did not stop")
		}
	})
	return ln.Addr().String()
}

// hold opens a keep-alive connection, sends one request, reads the answer
// and keeps the connection open, idle, as the hostile client does.
func hold(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, get)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	return c
}

// answersWithin asks path of a new client and fails unless the answer
// comes within d.
func answersWithin(t *testing.T, addr, path string, d time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: d, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := client.Get("http://" + addr + path)
	require.NoError(t, err, "a new client, after %s", time.Since(start))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestIdleConnectionsCannotShutOthersOut: a client that opens a connection
// for every slot, sends one request on each and keeps them idle does not
// keep a new client, or the health check, out: each answers within 5s,
// where a client shut out would wait for a slot for IdleTimeout (a loaded
// machine took just over a second). With the API's cap (1024) and an
// admin port's (64).
func TestIdleConnectionsCannotShutOthersOut(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1024, 64} {
		t.Run(strconv.Itoa(limit), func(t *testing.T) {
			t.Parallel()
			addr := serveLimited(t, hygieneRouter(t), limit)
			// From eight addresses, so that the client's share does not
			// stop it short of the cap.
			apitest.HoldIdle(t, addr, limit)
			answersWithin(t, addr, "/healthz", 5*time.Second)
			answersWithin(t, addr, "/readyz", 5*time.Second)
		})
	}
}

// TestSlowBodiesShutNoOneOut: a client on the same host as everyone else
// (127.0.0.1) that sends requests with bodies a byte every two seconds,
// as many as its share, or from eight addresses more than the cap, keeps no one out: the health
// check, a new client and a delivery over the sender's kept-alive
// connection are answered, each long before the 15s a trickled body could
// take. With the API's cap (1024) and an admin port's (64).
func TestSlowBodiesShutNoOneOut(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1024, 64} {
		t.Run(strconv.Itoa(limit), func(t *testing.T) {
			t.Parallel()
			addr := serveLimited(t, callersRouter(t), limit)
			sender := keepAlive(t) // as the outbox sender does
			deliver(t, sender, addr)
			refused := trickled("POST /people HTTP/1.1", "Content-Type: application/json\r\n")
			took := apitest.Trickle(t, addr, 1, limit/4, refused, http.StatusUnauthorized)
			t.Logf("%d trickled requests from one address answered within %s", limit/4, took)
			took = apitest.Trickle(t, addr, 8, 5*limit/4, refused, http.StatusUnauthorized)
			t.Logf("%d from eight addresses answered within %s", 5*limit/4, took)

			start := time.Now()
			answersWithin(t, addr, "/readyz", 5*time.Second)
			t.Logf("health check answered in %s", time.Since(start))
			start = time.Now()
			deliver(t, &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}, addr)
			t.Logf("a new client answered in %s", time.Since(start))
			start = time.Now()
			require.True(t, deliver(t, sender, addr), "the sender's connection was kept")
			t.Logf("a delivery answered in %s", time.Since(start))
		})
	}
}

// keepAlive is a client of its own that keeps its connections open.
func keepAlive(t *testing.T) *http.Client {
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	return &http.Client{Timeout: 5 * time.Second, Transport: transport}
}

// deliver posts a person with the caller's token through client, as the
// outbox sender does, and reports whether it went over a connection kept
// open from before.
func deliver(t *testing.T, client *http.Client, addr string) (reused bool) {
	t.Helper()
	return apitest.PostOver(t, client, "http://"+addr+"/people", apitest.PersonBody("Ada Lovelace", "ada@example.com", "111-1"),
		http.StatusCreated, "Authorization", "Bearer "+callerToken)
}

// TestCallersKeepTheirConnections: a caller's connection, on which a
// request was authorised, does not count against its address's share,
// and is closed for a newcomer only when no anonymous one is idle: a
// process hoarding idle connections from the caller's own address, or
// from elsewhere up to the cap, does not take it.
func TestCallersKeepTheirConnections(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, callersRouter(t), 8) // a share of 2
	sender := keepAlive(t)
	deliver(t, sender, addr)
	for range 3 { // past the share, from the sender's address
		hold(t, addr)
	}
	require.True(t, deliver(t, sender, addr), "the sender's connection was kept")
	// Past the cap: idle anonymous connections from elsewhere go first.
	for i := range 8 {
		c := from(t, "127.0.0."+strconv.Itoa(2+i%4), addr)
		_, err := io.WriteString(c, get)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
	require.True(t, deliver(t, sender, addr), "the sender's connection was kept")
}

// TestOneClientGetsAShare: a client holds at most a quarter of the slots;
// a new connection past its share closes its own longest idle one, not
// another client's.
func TestOneClientGetsAShare(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, hygieneRouter(t), 8) // a share of 2
	// Another client's idle connection, which the share must spare.
	other := from(t, "127.0.0.2", addr)
	_, err := io.WriteString(other, get)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(other), nil)
	require.NoError(t, err)
	resp.Body.Close()

	held := []net.Conn{hold(t, addr), hold(t, addr)}
	third := hold(t, addr)
	// One of the first two was closed for the third: it reads the end of
	// the stream. Which one is the longest idle depends on when net/http
	// marks each idle, after the client has its answer, so either may go.
	var open []net.Conn
	for _, c := range held {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(2*time.Second)))
		_, err := c.Read(make([]byte, 1))
		if !errors.Is(err, io.EOF) {
			var ne net.Error
			require.ErrorAs(t, err, &ne, "an open connection times out")
			require.True(t, ne.Timeout())
			open = append(open, c)
		}
	}
	require.Len(t, open, 1, "exactly one of the client's idle connections was closed")
	for _, c := range append(open, third, other) {
		require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
		_, err = io.WriteString(c, get)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err, "still open: the client's newest, and the other client's")
		resp.Body.Close()
	}
}

// from dials addr from another loopback address, as a client of its own.
func from(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestBusyConnectionsAreNeverClosed: a request in flight is never cut for
// a newcomer. Past its share, a client whose connections are all busy is
// refused; past the cap, with every connection busy, a new client waits
// for a slot and is served once one frees.
func TestBusyConnectionsAreNeverClosed(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var entered sync.WaitGroup
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered.Done()
			<-release
		}
	})
	addr := serveLimited(t, h, 4) // a share of 1 per client
	var busy []net.Conn
	for i := range 4 {
		entered.Add(1)
		c := from(t, "127.0.0."+strconv.Itoa(i+2), addr)
		_, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		busy = append(busy, c)
	}
	entered.Wait()

	// Past its share, with its one connection busy: refused at once.
	again := from(t, "127.0.0.2", addr)
	require.NoError(t, again.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err := again.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "refused, not served and not kept waiting")

	// Past the cap, everyone busy: a new client waits.
	newcomer := from(t, "127.0.0.9", addr)
	_, err = io.WriteString(newcomer, get)
	require.NoError(t, err)
	br := bufio.NewReader(newcomer)
	require.NoError(t, newcomer.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = br.Peek(1)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "served while every slot was busy: %v", err)

	close(release) // the requests in flight complete...
	for _, c := range busy {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err, "a busy connection was cut")
		resp.Body.Close()
	}
	require.NoError(t, newcomer.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(br, nil) // ...and free their slots, idle now
	require.NoError(t, err, "the newcomer is served once a slot frees")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
}

// TestStopsWhileWaitingForASlot: a server whose new connection waits for a
// slot still stops at once.
func TestStopsWhileWaitingForASlot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	release := make(chan struct{})
	defer close(release)
	srv := NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	srv.ReadTimeout = time.Second
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, slog.New(slog.DiscardHandler), srv, LimitConns(srv, ln, 1), 100*time.Millisecond)
	}()
	busy := from(t, "127.0.0.2", ln.Addr().String())
	_, err = io.WriteString(busy, get)
	require.NoError(t, err)
	from(t, "127.0.0.3", ln.Addr().String()) // waits for the one slot
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-done: // the grace ran out on the busy request: an error is fine
		t.Logf("stopped: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not stop")
	}
}

func TestLimitConnsWithoutCap(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.Same(t, ln, LimitConns(&http.Server{}, ln, 0))
}
