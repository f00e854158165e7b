package cdc

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/alarm"
)

// Collectors returns the source's metrics: the changes it streamed, and
// the replication slot's state, read when scraped.
func (s *Source) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.changes, &slotCollector{s: s}}
}

// statsTimeout bounds the slot's read at a scrape, and statsAlarmEvery how
// often, at most, a failing read is logged: every scrape fails alike while
// the database is down, and the gauges' absence says so at each one.
const (
	statsTimeout    = 2 * time.Second
	statsAlarmEvery = time.Minute
)

var (
	slotLagBytesDesc = prometheus.NewDesc("outbox_cdc_slot_lag_bytes",
		"WAL written since the replication slot's confirmed position: what a restarted reader would decode again (absent when the slot could not be read or does not exist).", nil, nil)
	slotLagSecondsDesc = prometheus.NewDesc("outbox_cdc_slot_lag_seconds",
		"Age of the oldest transaction this sender streamed and has not confirmed yet; 0 when none.", nil, nil)
	retainedDesc = prometheus.NewDesc("outbox_cdc_retained_wal_bytes",
		"WAL the replication slot keeps from removal. Alert well before it reaches max_slot_wal_keep_size, past which PostgreSQL invalidates the slot (absent when it could not be read or does not exist).", nil, nil)
	slotOKDesc = prometheus.NewDesc("outbox_cdc_slot_ok",
		"1 when the replication slot exists and is not invalidated; 0 otherwise (absent when it could not be read).", nil, nil)
	slotActiveDesc = prometheus.NewDesc("outbox_cdc_slot_active",
		"1 when some sender streams from the replication slot (absent when it could not be read).", nil, nil)
	readingDesc = prometheus.NewDesc("outbox_cdc_reading",
		"1 when this sender streams from the replication slot, 0 when it stands by or cannot.", nil, nil)
	fallbackDesc = prometheus.NewDesc("outbox_cdc_fallback",
		"1 while this sender polls for new rows because no sender can stream from the replication slot.", nil, nil)
)

// slotCollector reads the replication slot's state when scraped, from the
// server's view (pg_replication_slots), beside the reader's own.
type slotCollector struct {
	s     *Source
	alarm alarm.Alarm
}

func (sc *slotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{slotLagBytesDesc, slotLagSecondsDesc, retainedDesc, slotOKDesc, slotActiveDesc, readingDesc, fallbackDesc} {
		ch <- d
	}
}

func (sc *slotCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	var lag float64
	if oldest := sc.s.tr.oldest(); !oldest.IsZero() && sc.s.reading.Load() {
		lag = max(time.Since(oldest).Seconds(), 0)
	}
	gauge(slotLagSecondsDesc, lag)
	gauge(readingDesc, b2f(sc.s.reading.Load()))
	gauge(fallbackDesc, b2f(sc.s.fallback.Load()))
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	st, ok, err := sc.s.store.Slot(ctx, sc.s.cfg.Slot)
	if err != nil {
		if failed, ok := sc.alarm.Ring(time.Now(), statsAlarmEvery); ok {
			sc.s.log.Warn("read the replication slot for metrics; its figures are left out until it succeeds",
				slog.Int("failed_reads", failed), slog.String("error", err.Error()))
		}
		return
	}
	gauge(slotOKDesc, b2f(ok && !st.Lost))
	// With no slot nobody streams: 0, not absent, so that an alert on it
	// fires exactly then.
	gauge(slotActiveDesc, b2f(ok && st.Active))
	if !ok {
		return
	}
	gauge(slotLagBytesDesc, st.LagBytes)
	gauge(retainedDesc, st.Retained)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
