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

// Outcomes of users_commands_total, the broker's commands. created,
// refused and replayed are the inbox's, as above; invalid (400) and
// mismatch (422) are refusals the inbox does not store, answered all the
// same; retried is a command handed back to the broker for later (the
// database unavailable, its key or a conflicting one busy), answered
// nothing; parked is one Users could not read, kept for an operator;
// expired is one read after its outbox row expired (Outbox-Expires), not
// acted on: the sender has dead-lettered the row, or is about to.
const (
	CommandInvalid = "invalid"
	CommandRetried = "retried"
	CommandParked  = "parked"
	CommandExpired = "expired"
)

// commandOutcomes are users_commands_total's outcomes.
var commandOutcomes = []string{OutcomeCreated, OutcomeReplayed, OutcomeRefused, CommandInvalid, OutcomeMismatch, CommandRetried, CommandParked, CommandExpired}

// metrics are Users' counters, served on the admin listener. created and
// refused count once the inbox transaction committed; created plus refused
// is what the sender's delivered and dead results should add up to, and
// replayed shows redeliveries the inbox absorbed.
type metrics struct {
	inbox *prometheus.CounterVec
	// commands are the broker's commands by outcome, counted once the
	// answer committed (before the ack). Parked commands are an outcome
	// here, not a metric of their own, so that the outcomes add up to
	// every command handled.
	commands *prometheus.CounterVec
	// unpublished is the answers waiting for the relay, as last counted;
	// published counts those the broker acknowledged.
	unpublished prometheus.Gauge
	published   prometheus.Counter
	// brokerAuthFailures counts the broker's refusals of Users' NATS
	// login: a misconfiguration, and Users reads no command meanwhile.
	brokerAuthFailures prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		inbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "users_inbox_requests_total",
			Help: "POST /users requests by inbox outcome: created, refused (business rule), replayed, mismatch (422) or in_progress (409).",
		}, []string{"outcome"}),
	}
	m.commands = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "users_commands_total",
		Help: "Create-user commands from the broker by outcome: created, replayed, refused (business rule), invalid (400), mismatch (422), retried (handed back for later), parked (unreadable) or expired (read after its outbox row expired, not acted on).",
	}, []string{"outcome"})
	m.unpublished = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "users_answers_unpublished",
		Help: "Answers in Users' outbox not yet published to the reply stream, as last counted by the relay.",
	})
	m.published = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "users_answers_published_total",
		Help: "Answers the reply stream acknowledged.",
	})
	m.brokerAuthFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "users_broker_auth_failures_total",
		Help: "Times the broker refused Users' NATS login (USERS_NATS_PASSWORD): a misconfiguration, alert on any increase.",
	})
	// Every series exists from the start, so a rate over a fresh process
	// reads 0 rather than nothing.
	for _, o := range []string{OutcomeCreated, OutcomeRefused, OutcomeReplayed, OutcomeMismatch, OutcomeInProgress} {
		m.inbox.WithLabelValues(o)
	}
	for _, o := range commandOutcomes {
		m.commands.WithLabelValues(o)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.inbox, m.commands, m.unpublished, m.published, m.brokerAuthFailures}
}

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
