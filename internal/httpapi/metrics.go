package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxref/outboxref/internal/telemetry"
)

// RouteUnmatched is the route label of a request no route matched: an
// unknown path or method, or one refused before routing.
const RouteUnmatched = "unmatched"

// RequestMetrics returns a middleware that observes every request in
// http_request_duration_seconds{route,method,status}, registered on reg.
// The route is chi's pattern ("/students/{id}"), never the path, so that
// ids do not each make a series of their own.
//
// It is meant to wrap a whole chi router from outside: chi refuses
// middleware added after the first route, and NewRouter adds routes. For
// the pattern to outlive the request, the route context is created here
// and handed to the router, which then uses it as a parent router's.
func RequestMetrics(reg prometheus.Registerer) func(http.Handler) http.Handler {
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "http_request_duration_seconds",
		Help: "Time to answer each request on the public API, by route pattern (unmatched when none matched), method and status.",
		// Up to 10s: every database wait ends by the service's database
		// timeout (8s at most by default), and a 503 follows.
		Buckets: prometheus.DefBuckets,
	}, []string{"route", "method", "status"})
	reg.MustRegister(duration)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			rctx := chi.RouteContext(r.Context())
			if rctx == nil {
				rctx = chi.NewRouteContext()
				if routes, ok := next.(chi.Routes); ok {
					rctx.Routes = routes
				}
				r = r.WithContext(context.WithValue(r.Context(), chi.RouteCtxKey, rctx))
			}
			sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
			next.ServeHTTP(sw, r)
			route := rctx.RoutePattern()
			if route == "" {
				route = RouteUnmatched
			}
			duration.WithLabelValues(route, telemetry.Method(r.Method), strconv.Itoa(sw.status)).
				Observe(time.Since(start).Seconds())
		})
	}
}

// NewRegistry returns a registry with the Go runtime's and the process's
// collectors and cs: what an admin listener's /metrics serves.
func NewRegistry(cs ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(cs...)
	return reg
}

// MetricsRoute adds GET /metrics, serving reg in Prometheus' text format,
// to an admin router. A collector that fails is left out of the answer, and
// logged, rather than failing the scrape: the rest is what an operator
// needs most when something is wrong. Two scrapes at a time are served: a
// collector that reads the database borrows the service's pool, and
// scrapes must not crowd out the work they watch. Others wait their turn,
// for as long as the scraper said it waits (Prometheus sends
// X-Prometheus-Scrape-Timeout-Seconds), and at most metricsWait; only a
// scrape that waited that long is answered 503, as a problem, with
// Retry-After.
func MetricsRoute(r chi.Router, log *slog.Logger, reg prometheus.Gatherer) {
	serve := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	})
	turns := make(chan struct{}, 2)
	r.Get("/metrics", func(w http.ResponseWriter, r *http.Request) {
		wait := metricsWait
		if secs, err := strconv.ParseFloat(r.Header.Get("X-Prometheus-Scrape-Timeout-Seconds"), 64); err == nil && secs > 0 {
			wait = min(wait, time.Duration(secs*float64(time.Second)))
		}
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case turns <- struct{}{}:
		case <-r.Context().Done():
			return // the scraper gave up: nobody reads an answer
		case <-timer.C:
			p := Unavailable("two scrapes are being served and this one waited "+wait.String()+" for its turn; retry later", nil)
			p.Expected = true
			Render(w, r, p)
			return
		}
		defer func() { <-turns }()
		serve.ServeHTTP(w, r)
	})
}

// metricsWait is the longest a scrape waits for its turn: Prometheus'
// default scrape timeout.
const metricsWait = 10 * time.Second
