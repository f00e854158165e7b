package sender

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the sender's own counters. Compare claimed with the sum of
// results: a sender that claims more than it settles is building a backlog
// or looping on a row.
type metrics struct {
	claimed  prometheus.Counter
	results  *prometheus.CounterVec
	dead     *prometheus.CounterVec
	duration prometheus.Histogram
	// authFailures counts deliveries Users refused for the sender's
	// credentials: any increase is a misconfiguration to fix now, since
	// every row fails alike until it is.
	authFailures *prometheus.CounterVec
	// claimSize and recordSize show whether batching batches: rows per
	// claim query and answers per recording transaction. Under a backlog
	// both should approach SENDER_BATCH_SIZE; idle, one or a few.
	claimSize  prometheus.Histogram
	recordSize prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_sender_claimed_total", Help: "Outbox rows claimed for delivery.",
		}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_sender_results_total",
			Help: "Delivery results by verdict: delivered, retry, dead, released.",
		}, []string{"verdict"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_sender_dead_letters_total",
			Help: "Rows this sender dead-lettered, by reason class: alert when it rises.",
		}, []string{"reason_class"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_sender_request_duration_seconds",
			Help:    "Time from sending a row to Users until its answer (or failure).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_sender_auth_failures_total",
			Help: "Deliveries Users refused for the sender's credentials (401 or 403), by status: a misconfiguration, alert on any increase.",
		}, []string{"status"}),
		claimSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_sender_claim_size_rows",
			Help:    "Rows each claim query took, counting only claims that found work.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}),
		recordSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_sender_record_size_rows",
			Help:    "Answers recorded by each recording transaction.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}),
	}
}

func (v verdict) String() string {
	return [...]string{"delivered", "retry", "dead", "released"}[v]
}

// Collectors returns the sender's metrics and a collector of the outbox's
// state in the database, for registering on a registry.
func (s *Sender) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.metrics.claimed, s.metrics.results, s.metrics.dead, s.metrics.duration, s.metrics.authFailures,
		s.metrics.claimSize, s.metrics.recordSize, &outboxCollector{s: s}}
}

var (
	rowsDesc = prometheus.NewDesc("outbox_rows", "Outbox rows by state, read at scrape time.", []string{"state"}, nil)
	ageDesc  = prometheus.NewDesc("outbox_oldest_pending_age_seconds",
		"Age of the oldest pending outbox row: the delay a newly created student may see.", nil, nil)
)

// outboxCollector reads the outbox's totals when scraped, so the figures
// cover every sender and survive restarts.
type outboxCollector struct{ s *Sender }

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- rowsDesc; ch <- ageDesc }

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.s.q.OutboxStats(ctx, c.s.pool)
	if err != nil {
		c.s.log.Warn("outbox stats for metrics", slog.String("error", err.Error()))
		ch <- prometheus.NewInvalidMetric(rowsDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Pending), "pending")
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Delivered), "delivered")
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Dead), "dead")
	ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, st.OldestPendingSeconds)
}
