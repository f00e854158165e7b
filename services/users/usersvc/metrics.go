package usersvc

import (
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/inbox"
)

// Outcomes of users_inbox_requests_total. A new key ends as created or
// refused (a business rule said no, and the refusal is stored like a
// creation); the others are inbox.Result's.
const (
	OutcomeCreated    = "created"
	OutcomeRefused    = "refused"
	OutcomeReplayed   = string(inbox.ResultReplayed)
	OutcomeMismatch   = string(inbox.ResultMismatch)
	OutcomeInProgress = string(inbox.ResultInProgress)
)

// metrics are Users' counters, served on the admin listener. created and
// refused count once the inbox transaction committed; created plus refused
// is what the sender's delivered and dead results should add up to, and
// replayed shows redeliveries the inbox absorbed.
type metrics struct {
	inbox *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		inbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "users_inbox_requests_total",
			Help: "POST /users requests by inbox outcome: created, refused (business rule), replayed, mismatch (422) or in_progress (409).",
		}, []string{"outcome"}),
	}
	// Every series exists from the start, so a rate over a fresh process
	// reads 0 rather than nothing.
	for _, o := range []string{OutcomeCreated, OutcomeRefused, OutcomeReplayed, OutcomeMismatch, OutcomeInProgress} {
		m.inbox.WithLabelValues(o)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector { return []prometheus.Collector{m.inbox} }

// countCreate counts what one call of the store's CreateUser did. A new
// answer that names a resource created a user; one that names none is the
// stored refusal.
func (m *metrics) countCreate(out inbox.Outcome, replayed bool, err error) {
	r, ok := inbox.ResultOf(replayed, err)
	switch {
	case !ok:
		return
	case r != inbox.ResultNew:
		m.inbox.WithLabelValues(string(r)).Inc()
	case out.ResourceID != uuid.Nil:
		m.inbox.WithLabelValues(OutcomeCreated).Inc()
	default:
		m.inbox.WithLabelValues(OutcomeRefused).Inc()
	}
}
