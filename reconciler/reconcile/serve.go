package reconcile

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/service"
)

// Realm is the WWW-Authenticate challenge of /report.
const Realm = `Bearer realm="reconciler-admin"`

// adminMaxConns caps the admin port's open connections: a scraper, an
// operator and the healthcheck.
const adminMaxConns = 16

// server runs passes on a cadence and serves what they found.
type server struct {
	log *slog.Logger
	cfg Config
	c   *checker
	m   metrics

	// Written by the passes' loop only; known and marks carry an
	// incremental pass on from the last pass.
	known    cases
	marks    marks
	lastFull time.Time

	mu   sync.Mutex
	last *Report // the last pass's, for /report; nil until one finished
}

// metrics are the reconciler's Prometheus series (docs/observability.md).
// The drift gauges and the last pass's time appear with the first pass
// that ends: before it, nothing has been checked, and a zero would say
// otherwise.
type metrics struct {
	drift, oldest, lastPass, lastDuration *prometheus.GaugeVec
	failures                              *prometheus.CounterVec
}

func newMetrics() metrics {
	m := metrics{
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reconciler_drift",
			Help: "Cases of each class found by the last pass that covered it: stuck and dead wait for an operator; the other six break the invariant.",
		}, []string{"class"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reconciler_drift_oldest_age_seconds",
			Help: "Age of the oldest case of each class when the last pass ended, 0 when there is none.",
		}, []string{"class"}),
		lastPass: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reconciler_last_pass_timestamp_seconds",
			Help: "Unix time the last successful pass of each kind (full, incremental) ended.",
		}, []string{"kind"}),
		lastDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reconciler_last_pass_duration_seconds",
			Help: "How long the last successful pass of each kind took.",
		}, []string{"kind"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reconciler_pass_failures_total",
			Help: "Passes that could not finish: a database could not be read, or not within RECONCILER_STATEMENT_TIMEOUT.",
		}, []string{"kind"}),
	}
	// Counters exist from the start, so that increase() has a first value.
	for _, kind := range []string{KindFull, KindIncremental} {
		m.failures.WithLabelValues(kind)
	}
	return m
}

func (m metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.drift, m.oldest, m.lastPass, m.lastDuration, m.failures}
}

// serve runs passes until ctx ends: a full one first and every
// RECONCILER_FULL_EVERY, incremental ones every RECONCILER_INTERVAL in
// between, beside the admin port.
func serve(ctx context.Context, cfg Config, stdout io.Writer) error {
	log, err := service.NewLogger(stdout, cfg.LogLevel)
	if err != nil {
		return err
	}
	log = log.With(slog.String("service", "reconciler"))
	student, users, err := openPools(ctx, cfg)
	if err != nil {
		return err
	}
	defer student.Close()
	defer users.Close()
	s := &server{log: log, cfg: cfg, c: newChecker(cfg, student, users), m: newMetrics(), known: newCases()}
	log.Info("reconciler starting",
		slog.String("student_database", database.Where(cfg.StudentDatabaseURL)), slog.String("users_database", database.Where(cfg.UsersDatabaseURL)),
		slog.String("interval", cfg.Interval.String()), slog.String("full_every", cfg.FullEvery.String()),
		slog.Int("page_size", cfg.PageSize), slog.String("page_pause", cfg.PagePause.String()),
		slog.Int("admin_operators", len(cfg.Operators)))
	if len(cfg.Operators) == 0 {
		log.Info("/report refuses every request: RECONCILER_ADMIN_TOKENS lists no operator")
	}
	return service.RunParts(ctx, []service.Part{
		{Name: "passes", Run: s.loop},
		service.Server(log, "admin", "RECONCILER_ADMIN_ADDR", cfg.AdminAddr, adminMaxConns, s.router()),
	})
}

// loop runs a pass, waits RECONCILER_INTERVAL, and again, until ctx ends.
func (s *server) loop(ctx context.Context) error {
	for ctx.Err() == nil {
		s.pass(ctx)
		_ = pause(ctx, s.cfg.Interval) // ends early only when ctx does
	}
	return nil // stopping: not a failure
}

// pass runs one pass, full when one is due, and publishes what it found.
// A pass that fails leaves what the last one found in place, and is
// counted: the next incremental pass reads from where the last good one
// began.
func (s *server) pass(ctx context.Context) {
	kind := KindIncremental
	if s.lastFull.IsZero() || time.Since(s.lastFull) >= s.cfg.FullEvery {
		kind = KindFull
	}
	var p *pass
	var err error
	if kind == KindFull {
		p, err = s.c.full(ctx)
	} else {
		p, err = s.c.incremental(ctx, s.marks)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // stopping
		}
		s.m.failures.WithLabelValues(kind).Inc()
		s.log.Error("pass failed", slog.String("kind", kind), slog.String("error", err.Error()))
		return
	}
	known := p.found
	if kind == KindIncremental {
		known = s.known.merge(p)
	} else {
		s.lastFull = p.started
	}
	s.known, s.marks = known, p.clocks
	r := p.report(known, time.Now())
	var found []string
	for _, class := range drift.Classes {
		c := r.Classes[class]
		s.m.drift.WithLabelValues(string(class)).Set(float64(c.Count))
		s.m.oldest.WithLabelValues(string(class)).Set(c.OldestAgeSeconds)
		if c.Count > 0 {
			found = append(found, string(class))
		}
	}
	s.m.lastPass.WithLabelValues(kind).Set(float64(r.FinishedAt.UnixNano()) / 1e9)
	s.m.lastDuration.WithLabelValues(kind).Set(r.DurationSeconds)
	s.mu.Lock()
	s.last = &r
	s.mu.Unlock()
	level := slog.LevelInfo
	if r.Drift {
		level = slog.LevelWarn
	}
	s.log.LogAttrs(ctx, level, "pass done", slog.String("kind", kind), slog.Bool("drift", r.Drift),
		slog.String("classes_with_cases", joinWords(found)), slog.Float64("duration_seconds", r.DurationSeconds),
		slog.Int("students_judged", r.Judged.Students), slog.Int("users_judged", r.Judged.Users),
		slog.Int("rows_read", r.Read.Student.Rows+r.Read.Users.Rows),
		slog.Float64("longest_statement_seconds", max(r.Read.Student.LongestSeconds, r.Read.Users.LongestSeconds)))
}

// router is the admin port's: /healthz, /readyz (both databases answer),
// /metrics, and /report for the operators RECONCILER_ADMIN_TOKENS names.
func (s *server) router() chi.Router {
	admin := httpapi.NewAdminRouter(s.log, s.ping, "RECONCILER_ADMIN_ALLOWED_HOSTS", s.cfg.AdminAllowedHosts)
	httpapi.MetricsRoute(admin, s.log, httpapi.NewRegistry(s.m.collectors()...))
	admin.Group(func(r chi.Router) {
		// The report names students and users: unlike /metrics, no caller
		// may read it unnamed.
		r.Use(httpapi.Authenticate(auth.NewTokens(s.cfg.Operators), Realm))
		r.Get("/report", httpapi.Handle(s.reportHandler))
	})
	return admin
}

func (s *server) ping(ctx context.Context) error {
	return errors.Join(s.c.student.Ping(ctx), s.c.users.Ping(ctx))
}

func (s *server) reportHandler(w http.ResponseWriter, _ *http.Request) error {
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	if last == nil {
		p := httpapi.Unavailable("no pass has finished yet; the first is a full one, and the log says why a pass failed", nil)
		p.Expected = true
		return p
	}
	return httpapi.WriteJSON(w, http.StatusOK, last)
}
