package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

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
