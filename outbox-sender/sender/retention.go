package sender

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// PurgeDelivered deletes delivered rows older than SENDER_DELIVERED_RETENTION,
// batch rows per statement, and returns how many it deleted. Dead rows are
// never purged.
func (s *Sender) PurgeDelivered(ctx context.Context, batch int32) (int64, error) {
	var total int64
	for {
		bctx, cancel := database.WithDeadline(ctx, s.cfg.DatabaseTimeout)
		n, err := s.q.PurgeDelivered(bctx, s.pool, outboxdb.PurgeDeliveredParams{Retention: s.cfg.DeliveredRetention, BatchSize: batch})
		cancel()
		total += n
		if err != nil {
			return total, fmt.Errorf("purge delivered rows: %w", err)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// PurgeLoop purges delivered rows every SENDER_PURGE_INTERVAL until ctx
// ends.
func (s *Sender) PurgeLoop(ctx context.Context) error {
	t := time.NewTicker(s.cfg.PurgeInterval)
	defer t.Stop()
	for {
		n, err := s.PurgeDelivered(ctx, 1000)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Error("outbox purge failed", slog.String("error", err.Error()))
		case n > 0:
			s.log.Info("outbox purged", slog.Int64("rows", n), slog.Duration("retention", s.cfg.DeliveredRetention))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
