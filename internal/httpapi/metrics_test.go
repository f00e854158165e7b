package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestRequestMetrics: each request is observed under its route pattern,
// method and status, whatever became of it: routed, unknown, refused
// before routing, or a panic. Made-up methods share one label.
func TestRequestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := NewRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return nil })
	r.Get("/things/{id}", Handle(func(w http.ResponseWriter, _ *http.Request) error {
		return WriteJSON(w, http.StatusOK, map[string]string{})
	}))
	r.Post("/boom", func(http.ResponseWriter, *http.Request) { panic("boom") })
	h := RequestMetrics(reg)(r)

	for _, req := range []struct{ method, target string }{
		{http.MethodGet, "/things/1"}, {http.MethodGet, "/things/2"}, {http.MethodHead, "/things/3"},
		{http.MethodGet, "/nowhere"}, {http.MethodPost, "/things/1"}, {"BREW", "/things/1"}, {"SPILL", "/things/1"},
		{http.MethodGet, "/things/1?a=1&a=2"}, {http.MethodPost, "/boom"},
	} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(req.method, req.target, http.NoBody))
	}

	count := func(route, method, status string) int {
		t.Helper()
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["route"] == route && labels["method"] == method && labels["status"] == status {
					return int(m.GetHistogram().GetSampleCount())
				}
			}
		}
		return 0
	}
	require.Equal(t, 2, count("/things/{id}", "GET", "200"), "one series for every id")
	require.Equal(t, 1, count("/things/{id}", "HEAD", "200"))
	require.Equal(t, 1, count(RouteUnmatched, "GET", "404"))
	require.Equal(t, 1, count(RouteUnmatched, "POST", "405"))
	require.Equal(t, 2, count(RouteUnmatched, "_OTHER", "405"), "made-up methods are one label")
	require.Equal(t, 1, count(RouteUnmatched, "GET", "400"), "refused before routing")
	require.Equal(t, 1, count("/boom", "POST", "500"))
	require.Equal(t, 7, testutil.CollectAndCount(reg, "http_request_duration_seconds"), "series")
}

// TestMetricsRoute: the admin router's /metrics serves the registry with
// the Go runtime's and the process's collectors.
func TestMetricsRoute(t *testing.T) {
	t.Parallel()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_things_total", Help: "Things."})
	c.Add(3)
	log := slog.New(slog.DiscardHandler)
	r := NewRouter(log, func(context.Context) error { return nil })
	MetricsRoute(r, log, NewRegistry(c))
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", http.NoBody))
	require.Equal(t, http.StatusOK, w.Code)
	require.Contains(t, w.Body.String(), "\ntest_things_total 3\n")
	require.Contains(t, w.Body.String(), "\ngo_goroutines ")
	require.Contains(t, w.Body.String(), "\nprocess_start_time_seconds ")
}

// slowCollector takes its time, as one that reads a busy database does:
// each collection says on started that it has begun, then waits for a
// token on release. The test decides when each ends, however slow the
// machine.
type slowCollector struct{ started, release chan struct{} }

func (s slowCollector) Describe(chan<- *prometheus.Desc) {}
func (s slowCollector) Collect(chan<- prometheus.Metric) {
	s.started <- struct{}{}
	<-s.release
}

// TestExtraScrapesWait: two scrapes are served at a time and a third
// waits its turn, then succeeds; a scrape that waits longer than its
// scraper said it would is answered 503 as a problem with Retry-After,
// logged at warn level.
func TestExtraScrapesWait(t *testing.T) {
	t.Parallel()
	logs := &bytes.Buffer{}
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(&lockedWriter{w: logs, mu: &mu}, nil))
	r := NewRouter(log, func(context.Context) error { return nil })
	slow := slowCollector{started: make(chan struct{}, 3), release: make(chan struct{})}
	MetricsRoute(r, log, NewRegistry(slow))
	scrape := func(timeout string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/metrics", http.NoBody)
		if timeout != "" {
			req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", timeout)
		}
		r.ServeHTTP(w, req)
		return w
	}
	codes := make(chan int, 3)
	for range 3 {
		go func() { codes <- scrape("").Code }()
	}
	<-slow.started
	<-slow.started
	select {
	case <-slow.started:
		t.Fatal("a third scrape was served beside two")
	case <-time.After(100 * time.Millisecond):
	}
	slow.release <- struct{}{}
	<-slow.started // the third, once one of the two is done
	slow.release <- struct{}{}
	slow.release <- struct{}{}
	for range 3 {
		require.Equal(t, http.StatusOK, <-codes, "every scrape is served, the third after waiting")
	}

	for range 2 {
		go func() { codes <- scrape("").Code }()
	}
	<-slow.started
	<-slow.started // both are being served, until released
	w := scrape("0.1")
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"))
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	slow.release <- struct{}{}
	slow.release <- struct{}{}
	for range 2 {
		require.Equal(t, http.StatusOK, <-codes)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, logs.String(), `"level":"WARN","msg":"http request","method":"GET","path":"/metrics","status":503`)
	require.NotContains(t, logs.String(), `"level":"ERROR"`)
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestFailingReadinessIsLoggedPaced: probes of a readiness that fails are
// answered 503 each, and logged once a minute at warn level, not at
// error level each.
func TestFailingReadinessIsLoggedPaced(t *testing.T) {
	t.Parallel()
	logs := &bytes.Buffer{}
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(&lockedWriter{w: logs, mu: &mu}, nil))
	r := NewRouter(log, func(context.Context) error { return errors.New("dial tcp 10.0.0.5:5432: connection refused") })
	for range 5 {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", http.NoBody))
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, strings.Count(logs.String(), "\n"), "%s", logs)
	require.Contains(t, logs.String(), `"level":"WARN","msg":"not ready: the database is not reachable","failed_probes":1`)
}
