package sender

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/outboxwake"
)

// listen keeps a connection to Student's database listening on
// outboxwake.Channel (Student notifies it once new rows are committed, a
// redrive once dead rows are due again) and turns every notification into
// a wake-up of the claimer, until ctx ends. It holds a connection of its
// own, outside the pool: a listening connection is busy for as long as it
// listens.
//
// Wake-ups coalesce: wake holds at most one, so a thousand commits in a
// burst cost the claimer one claim, not a thousand. When the connection
// breaks, listen reconnects with a backoff and wakes the claimer once
// connected again, since rows may have been committed unheard meanwhile.
// Until then, the claimer's poll covers for it.
func (s *Sender) listen(ctx context.Context, wake chan<- struct{}) {
	failures := 0 // consecutive failures to listen
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, wake, &failures)
		if ctx.Err() != nil {
			return
		}
		failures++
		// Logged the first time and every tenth, like a failing claim:
		// while the database is down, one line a minute says enough.
		if failures%10 == 1 {
			s.log.Warn("listen for outbox notifications; polling every SENDER_POLL_INTERVAL meanwhile",
				slog.Int("failures", failures), slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(100*time.Millisecond<<min(failures, 6), 5*time.Second)):
		}
	}
}

// listenOnce connects, listens and relays notifications until the
// connection fails or ctx ends.
func (s *Sender) listenOnce(ctx context.Context, wake chan<- struct{}, failures *int) error {
	cfg := s.pool.Config().ConnConfig
	// Seen in pg_stat_activity beside the pool's connections.
	cfg.RuntimeParams["application_name"] = "outbox-sender listener"
	cctx, cancel := database.WithDeadline(ctx, s.cfg.DatabaseTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(cctx, "LISTEN "+outboxwake.Channel); err != nil {
		return err
	}
	if *failures > 0 {
		s.log.Info("listening for outbox notifications again", slog.Int("failures", *failures))
	}
	*failures = 0
	// Anything committed while nobody listened would otherwise wait for
	// the poll.
	wakeUp(wake)
	for {
		// A silent, broken connection ends here too: the dialer's TCP
		// keepalives (internal/database) declare it dead within about 20s.
		// A relay that answers keepalives itself can hide a dead server
		// for longer; the poll covers for the listener meanwhile.
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wakeUp(wake)
	}
}

// wakeUp wakes the claimer, or leaves the wake-up already pending.
func wakeUp(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
