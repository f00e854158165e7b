// Package outboxwake wakes the outbox sender when outbox rows become due
// now, so that it need not wait for its next poll: Student notifies
// Channel once new rows are committed, the sender listens on it.
//
// The notification is sent after the writing transaction commits, not in
// it. PostgreSQL serialises the commits of every transaction that sent a
// NOTIFY (a lock held from the notification queue's write through the commit
// record's flush), so a NOTIFY inside each intake transaction turns group
// commit off: one flush per student. Measured on this project's intake, it
// held commits to exactly 1.00 per WAL flush, against 2 to 2.5 without it.
//
// Sent after commit, a notification can be lost: the process may stop
// between the commit and the notification, or no sender may be listening.
// The sender's poll finds those rows a SENDER_POLL_INTERVAL later, so a lost
// notification costs latency, never a row.
package outboxwake

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/database"
)

// Channel is what Student notifies and the sender listens on.
const Channel = "outbox_due"

// notify is one notification in a transaction of its own. A notification
// carries nothing that must survive a crash (a lost one costs one poll), so
// its commit does not wait for a disk flush.
const notify = "SELECT set_config('synchronous_commit', 'off', true), pg_notify('" + Channel + "', '')"

// Notify sends one notification now, in a transaction of its own: after
// the commit it announces, never inside that transaction (see the package
// comment).
func Notify(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, notify); err != nil {
		return fmt.Errorf("notify %s: %w", Channel, err)
	}
	return nil
}

// Notifier sends notifications for a stream of commits, coalesced: Kick
// asks for one, and kicks that arrive while one is being sent are answered
// together by the next. A thousand students committed in a second cost a
// handful of notifications, and none waits for another's.
type Notifier struct {
	pool    *pgxpool.Pool
	timeout time.Duration
	kick    chan struct{}
}

// NewNotifier returns a Notifier on pool's database; each notification is
// bounded by timeout. Kicks do nothing until Run runs.
func NewNotifier(pool *pgxpool.Pool, timeout time.Duration) *Notifier {
	return &Notifier{pool: pool, timeout: timeout, kick: make(chan struct{}, 1)}
}

// Kick asks for a notification soon. It never blocks.
func (n *Notifier) Kick() {
	select {
	case n.kick <- struct{}{}:
	default: // one is already asked for, and will cover this commit too
	}
}

// Run sends a notification for each batch of kicks until ctx ends. A
// failure is logged at most once per failing spell: the poll covers for it.
func (n *Notifier) Run(ctx context.Context, log *slog.Logger) {
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		}
		nctx, cancel := database.WithDeadline(ctx, n.timeout)
		err := Notify(nctx, n.pool)
		cancel()
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			log.Warn("wake the outbox sender; it will find the rows at its next poll", slog.String("error", err.Error()))
			failing = true
		case err == nil && failing:
			log.Info("waking the outbox sender again")
			failing = false
		}
	}
}
