package studentsvc

import (
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/outbox"
)

// metrics are Student's counters, served on the admin listener. Each counts
// an effect once its transaction committed, never before: a rolled back
// request counts nothing. outboxRows is the "inserted" side of the outbox;
// the sender's outbox_sender_results_total is the "published" side, and the
// two should not drift apart.
type metrics struct {
	created    prometheus.Counter
	outboxRows *prometheus.CounterVec
	keys       *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "student_students_created_total", Help: "Students created (committed).",
		}),
		outboxRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_outbox_rows_written_total",
			Help: "Outbox rows written (committed), by operation: the inserted side of the outbox.",
		}, []string{"operation"}),
		keys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "student_idempotency_requests_total",
			Help: "POST /students requests with a client Idempotency-Key, by outcome: new, replayed, mismatch (422) or in_progress (409).",
		}, []string{"outcome"}),
	}
	// Every series exists from the start, so a rate over a fresh process
	// reads 0 rather than nothing.
	m.outboxRows.WithLabelValues(outbox.OperationCreateUser)
	for _, r := range []inbox.Result{inbox.ResultNew, inbox.ResultReplayed, inbox.ResultMismatch, inbox.ResultInProgress} {
		m.keys.WithLabelValues(string(r))
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.created, m.outboxRows, m.keys}
}

// countCreate counts what one call of the store's CreateStudent did. keyed
// says whether the client sent a key. A new answer that names a resource
// created a student and its outbox row, together, in the transaction that
// just committed; a refusal or a replay wrote nothing.
func (m *metrics) countCreate(keyed bool, out inbox.Outcome, replayed bool, err error) {
	if keyed {
		if r, ok := inbox.ResultOf(replayed, err); ok {
			m.keys.WithLabelValues(string(r)).Inc()
		}
	}
	if err == nil && !replayed && out.ResourceID != uuid.Nil {
		m.created.Inc()
		m.outboxRows.WithLabelValues(outbox.OperationCreateUser).Inc()
	}
}
