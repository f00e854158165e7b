package poll

import (
	"context"
	"log/slog"
	"time"
)

// listen keeps a connection to Student's database listening on
// outboxwake.Channel (Student notifies it once new rows are committed, a
// redrive once dead rows are due again) and turns every notification into
// a wake-up of the table feed, until ctx ends.
//
// Wake-ups coalesce: wake holds at most one, so a thousand commits in a
// burst cost one claim, not a thousand. When the connection breaks, listen
// reconnects with a backoff and wakes the feed once connected again, since
// rows may have been committed unheard meanwhile. Until then, the poll
// covers for it.
func (s *Source) listen(ctx context.Context) {
	failures := 0 // consecutive failures to listen
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, &failures)
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
func (s *Source) listenOnce(ctx context.Context, failures *int) error {
	l, err := s.store.Listen(ctx)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	if *failures > 0 {
		s.log.Info("listening for outbox notifications again", slog.Int("failures", *failures))
	}
	*failures = 0
	// Anything committed while nobody listened would otherwise wait for
	// the poll.
	wakeUp(s.wake)
	for {
		// A silent, broken connection ends here too: the dialer's TCP
		// keepalives (internal/database) declare it dead within about 20s.
		// A relay that answers keepalives itself can hide a dead server
		// for longer; the poll covers for the listener meanwhile.
		if err := l.Wait(ctx); err != nil {
			return err
		}
		wakeUp(s.wake)
	}
}

// wakeUp wakes the feed, or leaves the wake-up already pending.
func wakeUp(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
