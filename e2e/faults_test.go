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
	logFile, err := os.Create(filepath.Join(dir, "toxiproxy.log"))
	require.NoError(t, err)
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
	return &faultProxy{t: t, proxy: proxy}
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
