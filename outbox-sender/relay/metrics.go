package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/alarm"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// metrics are the sender's own counters. Compare claimed with the sum of
// results: a sender that claims more than it settles is building a backlog
// or looping on a row.
//
// Every count here is of a committed effect: a result is counted after the
// transaction that recorded it committed, and only when this sender's
// write took effect (not a retry fenced out by a lost lease, nor a
// delivery another sender had recorded already). So across all senders,
// each settlement of a row is counted once.
type metrics struct {
	claimed prometheus.Counter
	// results is the "published" side of the outbox: compare
	// verdict=~"delivered|dead" with the rows Student wrote.
	results *prometheus.CounterVec
	dead    *prometheus.CounterVec
	// lag is what a student waits for its user, end to end: from its
	// outbox row's creation to the answer recorded, retries and outages
	// included.
	lag prometheus.Histogram
	// attempts shows how hard rows are to settle: mostly 1 when Users is
	// well, a long tail during its outages.
	attempts prometheus.Histogram
	// claimSize and recordSize show whether batching batches: rows per
	// claim query and answers per recording transaction. Under a backlog
	// both should approach SENDER_BATCH_SIZE; idle, one or a few.
	claimSize  prometheus.Histogram
	recordSize prometheus.Histogram
	// replies counts Users' answers read from a broker's reply stream, by
	// what each did (SENDER_TRANSPORT=nats).
	replies *prometheus.CounterVec
}

// lagBuckets run from a few milliseconds (a delivery on a healthy system)
// to days: a row retried through an outage settles hours later, up to
// SENDER_MAX_AGE (72h by default), and a redriven row later still.
var lagBuckets = []float64{
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
	60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600,
	24 * 3600, 48 * 3600, 72 * 3600, 7 * 24 * 3600,
}

func newMetrics() *metrics {
	m := &metrics{
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_sender_claimed_total", Help: "Outbox rows claimed for delivery.",
		}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_sender_results_total",
			Help: "Delivery results this sender recorded, by verdict (delivered, retry, dead, released, published, unread) and reason class (\"none\" when there is none). " +
				"verdict=~\"delivered|dead\" is the settled (published) side of the outbox.",
		}, []string{"verdict", "reason_class"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_sender_dead_letters_total",
			Help: "Rows this sender dead-lettered, by reason class: alert when it rises.",
		}, []string{"reason_class"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_sender_delivery_lag_seconds",
			Help:    "Time from an outbox row's creation until this sender recorded the answer that settled it (delivered or dead).",
			Buckets: lagBuckets,
		}),
		attempts: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_sender_settled_row_attempts",
			Help:    "Attempts a row took, observed when this sender settled it (delivered or dead).",
			Buckets: []float64{1, 2, 3, 5, 10, 20, 50, 100},
		}),
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
	m.replies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_sender_replies_total",
		Help: "Users' answers read from the broker's reply stream (SENDER_TRANSPORT=nats), by what each did: linked, refused, conflict, already-settled, ignored, unmatched, repeat.",
	}, []string{"outcome"})
	for _, o := range store.ReplyOutcomes {
		m.replies.WithLabelValues(o)
	}
	// Every series an alert or the dashboard reads starts at 0: a series
	// born at its first increment is missing from sums until then (a
	// restarted sender facing a Users that is down reports no settled
	// series at all, and inserted minus settled is then empty, not
	// growing), and increase() misses that first step.
	// Only the series that can move: a class that is never retried has
	// no retry series, one that is never dead no dead series.
	m.results.WithLabelValues(delivered, reasonLabel(""))
	m.results.WithLabelValues(released, reasonLabel(""))
	m.results.WithLabelValues(published, reasonLabel(""))
	m.results.WithLabelValues(unread, reasonLabel(""))
	for _, class := range outbox.RetryClasses {
		m.results.WithLabelValues(retry, class)
	}
	for _, class := range outbox.DeadClasses {
		m.results.WithLabelValues(dead, class)
		m.dead.WithLabelValues(class)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.claimed, m.results, m.dead, m.lag, m.attempts, m.claimSize, m.recordSize, m.replies}
}

// reasonLabel is a reason class as a label value: an empty label would
// read as a missing one in PromQL, so "none" says there was no reason.
func reasonLabel(class string) string {
	if class == "" {
		return "none"
	}
	return class
}

// settled counts one result this sender's recording transaction applied,
// once that transaction committed. recorded is when it committed.
func (m *metrics) settled(v, class string, row store.Row, recorded time.Time) {
	m.results.WithLabelValues(v, reasonLabel(class)).Inc()
	if v != delivered && v != dead {
		return
	}
	// created_at comes from the database's clock, recorded from the
	// sender's: a skew between the two must not make a negative lag.
	m.lag.Observe(max(recorded.Sub(row.CreatedAt).Seconds(), 0))
	m.attempts.Observe(float64(row.Attempts))
	if v == dead {
		m.dead.WithLabelValues(class).Inc()
	}
}

var (
	rowsDesc = prometheus.NewDesc("outbox_rows", "Outbox rows by state, read at scrape time (absent when the read failed).", []string{"state"}, nil)
	ageDesc  = prometheus.NewDesc("outbox_oldest_pending_age_seconds",
		"Age of the oldest pending outbox row: the delay a newly created student may see (absent when the read failed).", nil, nil)
	publishedAgeDesc = prometheus.NewDesc("outbox_oldest_published_age_seconds",
		"Age of the oldest published outbox row (SENDER_TRANSPORT=nats): a student whose command the broker holds and Users has not answered; 0 when none (absent when the read failed).", nil, nil)
	readOKDesc = prometheus.NewDesc("outbox_stats_read_ok",
		"1 when this scrape read the outbox's state from the database, 0 when the read failed and outbox_rows and the oldest ages are missing.", nil, nil)
)

// statsTimeout bounds the database read of a scrape: Prometheus' own
// default scrape timeout is 10s, and an answer without the database's
// figures is worth more than none.
const statsTimeout = 2 * time.Second

// statsAlarmEvery is how often, at most, a failing read is logged: every
// scrape fails alike while the database is down, and the gauge says so at
// each one.
const statsAlarmEvery = time.Minute

// outboxCollector reads the outbox's totals when scraped, so the figures
// cover every sender and survive restarts. A failed read leaves those
// figures out instead of failing the scrape: the sender's own counters
// matter most exactly when the database is in trouble.
type outboxCollector struct {
	store *store.Store
	log   *slog.Logger
	alarm alarm.Alarm
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rowsDesc
	ch <- ageDesc
	ch <- publishedAgeDesc
	ch <- readOKDesc
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	st, err := c.store.Stats(ctx)
	if err != nil {
		if failed, ok := c.alarm.Ring(time.Now(), statsAlarmEvery); ok {
			c.log.Warn("read outbox stats for metrics; outbox_rows and the oldest ages are left out until it succeeds",
				slog.Int("failed_reads", failed), slog.String("error", err.Error()))
		}
		ch <- prometheus.MustNewConstMetric(readOKDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(readOKDesc, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Pending), outbox.StatePending)
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Published), outbox.StatePublished)
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Delivered), outbox.StateDelivered)
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Dead), outbox.StateDead)
	ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, st.OldestPending.Seconds())
	ch <- prometheus.MustNewConstMetric(publishedAgeDesc, prometheus.GaugeValue, st.OldestPublished.Seconds())
}
