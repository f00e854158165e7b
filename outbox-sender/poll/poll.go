// Package poll is the outbox sender's polling source of new rows
// (SENDER_SOURCE=poll): the outbox table itself, claimed with SKIP LOCKED
// whenever Student's database notifies that rows were committed, and every
// SENDER_POLL_INTERVAL for what no notification announces (retries coming
// due, leases run out, rows committed while the listener reconnected).
//
// Its Table feed is also the change-data-capture source's way to the rows
// the stream does not carry (package cdc).
package poll

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// Table is the feed of due rows in the outbox table.
type Table struct {
	store *store.Store
	lease store.Lease
	// every is how long to sleep, when nothing was due, before looking
	// again without being woken (SENDER_POLL_INTERVAL).
	every time.Duration
	// wake receives when rows were committed; nil when nothing notifies.
	wake <-chan struct{}
	// leaveNew is how long to leave a new row to a stream; nil for never.
	leaveNew func() time.Duration
	// woken is when Wait last took a notification.
	woken time.Time
}

// NewTable returns the table feed. wake, when not nil, wakes it at once;
// leaveNew, when not nil, says how long a new, untried row is left to
// another feed.
func NewTable(st *store.Store, lease store.Lease, every time.Duration, wake <-chan struct{}, leaveNew func() time.Duration) *Table {
	return &Table{store: st, lease: lease, every: every, wake: wake, leaveNew: leaveNew}
}

func (t *Table) String() string { return "table" }

// Wait claims again at once while claims come back full (a backlog), after
// a failure (the claim loop has backed off already) and at the start.
// Otherwise nothing more is due: it sleeps until a notification says rows
// were committed, or until the poll.
//
// Commits come in streams: a moment's wait after a notification
// (relay.WakeLinger) lets the next few join its claim instead of each
// costing one, and their notifications coalesce meanwhile. A notification
// that was already waiting when Wait began came during the last claim: a
// stream, so it lingers. One that Wait had to wait for, WakeQuiet or more
// after the notification before, is a lone commit, claimed at once.
func (t *Table) Wait(ctx context.Context, last relay.Claimed) int {
	if last.Asked == 0 || last.Err != nil || last.Full() {
		return relay.Unknown
	}
	select {
	case <-t.wake:
		t.woken = time.Now()
		return linger(ctx)
	default:
	}
	poll := time.NewTimer(t.every)
	defer poll.Stop()
	select {
	case <-ctx.Done():
		return 0
	case <-t.wake:
		now := time.Now()
		lone := now.Sub(t.woken) >= relay.WakeQuiet
		t.woken = now
		if lone {
			return relay.Unknown
		}
		return linger(ctx)
	case <-poll.C:
	}
	return relay.Unknown
}

// linger waits relay.WakeLinger for more commits to join the claim.
func linger(ctx context.Context) int {
	t := time.NewTimer(relay.WakeLinger)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return 0
	case <-t.C:
		return relay.Unknown
	}
}

// Claim claims up to n due rows (store.ClaimDue).
func (t *Table) Claim(ctx context.Context, n int) ([]store.Row, error) {
	crashpoint.Pause(crashpoint.SenderBeforeClaim)
	if t.leaveNew != nil {
		if d := t.leaveNew(); d > 0 {
			return t.store.ClaimDueLeavingNew(ctx, t.lease, n, d)
		}
	}
	return t.store.ClaimDue(ctx, t.lease, n)
}

// Source is the polling source: the table, woken by notifications.
type Source struct {
	log   *slog.Logger
	store *store.Store
	table *Table
	wake  chan struct{}
}

// New returns the polling source on st.
func New(log *slog.Logger, st *store.Store, lease store.Lease, every time.Duration) *Source {
	wake := make(chan struct{}, 1)
	return &Source{log: log, store: st, wake: wake, table: NewTable(st, lease, every, wake, nil)}
}

// Feeds is the table alone.
func (s *Source) Feeds() []relay.Feed { return []relay.Feed{s.table} }

// Settled needs nothing: the table is the truth.
func (s *Source) Settled([]int64) {}

// Run listens for notifications until ctx ends.
func (s *Source) Run(ctx context.Context) { s.listen(ctx) }
