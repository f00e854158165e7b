//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// faultProxy is Toxiproxy, embedded in the test process, between the
// sender(s) and Users. Faults are Toxiproxy's standard toxics, each applied
// to one direction: "upstream" is sender→Users (requests), "downstream" is
// Users→sender (answers). The names and attributes are exactly those of
// Toxiproxy's documentation, so a scenario reads like a Toxiproxy recipe.
type faultProxy struct {
	t     *testing.T
	proxy *toxiproxy.Proxy
}

func newFaultProxy(t *testing.T, dir, name, upstream string) *faultProxy {
	t.Helper()
	return &faultProxy{t: t, proxy: startToxiproxy(t, filepath.Join(dir, "toxiproxy.log"), name, upstream)}
}

// startToxiproxy runs one Toxiproxy proxy to upstream, logging to logPath,
// until the test ends.
func startToxiproxy(t *testing.T, logPath, name, upstream string) *toxiproxy.Proxy {
	t.Helper()
	f, err := os.Create(logPath)
	require.NoError(t, err)
	// Toxiproxy's connection goroutines may log after the proxy is
	// removed; their lines are dropped rather than written to a closed file.
	logFile := &closableLog{f: f}
	logger := zerolog.New(logFile).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), logger)
	// Port 0: Toxiproxy records the port it got in Listen, and keeps it
	// when the proxy is disabled and enabled again.
	proxy := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
	require.NoError(t, server.Collection.Add(proxy, true))
	t.Cleanup(func() {
		_ = server.Collection.Remove(name)
		logFile.Close()
	})
	return proxy
}

// closableLog is a log file that ignores writes once closed.
type closableLog struct {
	mu     sync.Mutex
	f      *os.File
	closed bool
}

func (l *closableLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return len(p), nil
	}
	return l.f.Write(p)
}

func (l *closableLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return l.f.Close()
}

// addr is where the sender reaches Users.
func (f *faultProxy) addr() string { return f.proxy.Listen }

// add adds a toxic to one direction of every connection, existing and new.
func (f *faultProxy) add(name, typ, stream string, attrs map[string]any) {
	f.t.Helper()
	body, err := json.Marshal(map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	})
	require.NoError(f.t, err)
	_, err = f.proxy.Toxics.AddToxicJson(bytes.NewReader(body))
	require.NoError(f.t, err, "add toxic %s", name)
}

func (f *faultProxy) remove(name string) {
	f.t.Helper()
	require.NoError(f.t, f.proxy.Toxics.RemoveToxic(context.Background(), name), "remove toxic %s", name)
}

// disable closes the listener and every connection: the sender gets
// "connection refused" until enable.
func (f *faultProxy) disable() { f.proxy.Stop() }

func (f *faultProxy) enable() {
	f.t.Helper()
	require.NoError(f.t, f.proxy.Start())
}

// httpFaults is a small HTTP reverse proxy in front of Users for the faults
// that live above TCP: answering 5xx. Toxiproxy forwards to it, and it
// forwards to Users.
type httpFaults struct {
	mode     atomic.Int32
	rejected atomic.Int64
	replaced atomic.Int64

	mu           sync.Mutex
	replacedKeys map[string]bool
}

const (
	// passThrough forwards everything untouched.
	passThrough int32 = iota
	// reject503 answers 503 without forwarding: Users never sees the
	// request, as when a load balancer has no healthy backend.
	reject503
	// replace502 forwards the request, lets Users commit and answer, then
	// throws the answer away and sends 502: the sender sees a failure for
	// an operation that happened.
	replace502
)

var errAnswerReplaced = errors.New("answer replaced with 502 by the e2e fault proxy")

func newHTTPFaults(t *testing.T, upstream string) (*httpFaults, string) {
	t.Helper()
	target, err := url.Parse("http://" + upstream)
	require.NoError(t, err)
	h := &httpFaults{replacedKeys: map[string]bool{}}

	badGateway := func(w http.ResponseWriter, _ *http.Request, _ error) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"Bad Gateway","status":502}`))
	}
	pass := httputil.NewSingleHostReverseProxy(target)
	pass.ErrorHandler = badGateway
	replacing := httputil.NewSingleHostReverseProxy(target)
	replacing.ErrorHandler = badGateway
	replacing.ModifyResponse = func(resp *http.Response) error {
		if resp.StatusCode >= 500 {
			return nil // already a failure
		}
		h.replaced.Add(1)
		h.mu.Lock()
		h.replacedKeys[resp.Request.Header.Get("Idempotency-Key")] = true
		h.mu.Unlock()
		return errAnswerReplaced
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch h.mode.Load() {
			case reject503:
				h.rejected.Add(1)
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"type":"about:blank","title":"Service Unavailable","status":503}`))
			case replace502:
				replacing.ServeHTTP(w, r)
			default:
				pass.ServeHTTP(w, r)
			}
		}),
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return h, ln.Addr().String()
}

func (h *httpFaults) set(mode int32) { h.mode.Store(mode) }

// keysReplaced is how many distinct operations Users performed while the
// sender was told they failed.
func (h *httpFaults) keysReplaced() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.replacedKeys)
}

// dbProxy is an embedded Toxiproxy in front of a PostgreSQL cluster, for
// the scenarios that freeze a database connection (11 to 13). Only one
// process's connections go through it, the sender's or Users'; everything
// else, the checker included, connects directly.
//
// It freezes with a toxic of its own, freezeToxic, on both directions.
// Toxiproxy's timeout toxic with timeout 0 also stops forwarding without
// closing, but it cannot stand for the fault these scenarios are about: it
// passes a client's close straight through while it drops the data, and
// removing it closes every connection it was on (TimeoutToxic.Cleanup in
// v2.5.0). Either way PostgreSQL hears at once that the client is gone and
// rolls its transaction back, so a build without any limits would pass. A
// real black hole (a NAT or firewall that forgot the connection, a host that
// vanished) loses the client's goodbye too, and afterwards nothing tells the
// server: it keeps the session, its transaction and its row locks.
type dbProxy struct {
	t        *testing.T
	proxy    *toxiproxy.Proxy
	app      string // application_name of the connections through it
	up, down *freezeToxic
}

// newDBProxy starts a proxy to the server of dbURL and returns it with the
// URL that connects through it. The connections through it carry
// application_name "e2e-NAME", so that pg_stat_activity tells them apart.
func newDBProxy(t *testing.T, dir, name, dbURL string) (*dbProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	d := &dbProxy{t: t, app: "e2e-" + name}
	d.proxy = startToxiproxy(t, filepath.Join(dir, "toxiproxy-"+name+".log"), name, u.Host)
	for _, stream := range []string{"upstream", "downstream"} {
		body, err := json.Marshal(map[string]any{"name": "freeze-" + stream, "type": freezeToxicType, "stream": stream, "toxicity": 1.0})
		require.NoError(t, err)
		w, err := d.proxy.Toxics.AddToxicJson(bytes.NewReader(body))
		require.NoError(t, err, "add the freeze toxic")
		ft, ok := w.Toxic.(*freezeToxic)
		require.True(t, ok, "toxic type %T", w.Toxic)
		if stream == "upstream" {
			d.up = ft
		} else {
			d.down = ft
		}
	}
	// Runs before the proxy is removed (cleanups run last first): caught
	// connections are let go, so nothing is left blocked in the test.
	t.Cleanup(func() {
		d.up.release()
		d.down.release()
	})
	u.Host = d.proxy.Listen
	q := u.Query()
	q.Set("application_name", d.app)
	u.RawQuery = q.Encode()
	return d, u.String()
}

// freeze stops forwarding in both directions, without closing anything.
func (d *dbProxy) freeze() {
	d.up.frozen.Store(true)
	d.down.frozen.Store(true)
}

// heal forwards again for connections opened from now on, and for those
// that lost nothing during the freeze. Caught connections stay broken.
func (d *dbProxy) heal() {
	d.up.frozen.Store(false)
	d.down.frozen.Store(false)
}

// caught is how many connections lost data or their close to the freeze
// (in either direction, counted per direction), and how many bytes.
func (d *dbProxy) caught() (directions, bytes int64) {
	return d.up.caught.Load() + d.down.caught.Load(), d.up.dropped.Load() + d.down.dropped.Load()
}

// freezeToxicType is freezeToxic's name in Toxiproxy's registry.
const freezeToxicType = "e2e_freeze"

func init() { toxics.Register(freezeToxicType, new(freezeToxic)) }

// freezeToxic is a network black hole for one direction. While frozen it
// drops every byte and every close. A connection's direction that lost
// anything to it is caught and stays caught after the heal: whatever its
// writer sends later (a PostgreSQL client's Terminate message, its close)
// is dropped too, so the reader never hears from it again and its side is
// never closed by the proxy. A direction that lost nothing, or that was
// opened after the heal, forwards normally. The scenario drives it with
// dbProxy.freeze and heal, not through Toxiproxy's API.
type freezeToxic struct {
	frozen  atomic.Bool
	caught  atomic.Int64
	dropped atomic.Int64

	mu   sync.Mutex
	done chan struct{} // closed at cleanup: caught directions close
}

type freezeState struct{ caught bool }

// NewState makes freezeToxic a Toxiproxy StatefulToxic: each direction of
// each connection remembers whether it was caught.
func (t *freezeToxic) NewState() any { return new(freezeState) }

func (t *freezeToxic) released() chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		t.done = make(chan struct{})
	}
	return t.done
}

func (t *freezeToxic) release() {
	ch := t.released()
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// Pipe forwards, drops or holds each chunk; a nil chunk is the writer's
// close.
func (t *freezeToxic) Pipe(stub *toxics.ToxicStub) {
	st, _ := stub.State.(*freezeState)
	if st == nil {
		st = new(freezeState)
		stub.State = st
	}
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if !st.caught && t.frozen.Load() {
				st.caught = true
				t.caught.Add(1)
			}
			switch {
			case c == nil && st.caught:
				// The close is lost like the data: the reader is never told.
				select {
				case <-stub.Interrupt:
				case <-t.released():
					stub.Close()
				}
				return
			case c == nil:
				stub.Close()
				return
			case st.caught:
				t.dropped.Add(int64(len(c.Data)))
			default:
				stub.Output <- c
			}
		}
	}
}
