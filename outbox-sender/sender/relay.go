package sender

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/outbox-sender/cdc"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/poll"
	"github.com/outboxref/outboxref/outbox-sender/relay"
	"github.com/outboxref/outboxref/outbox-sender/usershttp"
)

// Relay is the sender's delivery put together: the engine, fed by the
// source SENDER_SOURCE names, delivering through HTTP to Users, recording
// in Student's database.
type Relay struct {
	cfg        Config
	log        *slog.Logger
	store      *store.Store
	source     relay.Source
	engine     *relay.Engine
	collectors []prometheus.Collector
}

// New puts the relay together on pool, Student's database as the sender's
// role. This is the one place that asks which source the configuration
// names; past it, the engine sees a relay.Source.
func New(log *slog.Logger, pool *pgxpool.Pool, cfg Config) *Relay {
	st := store.New(pool, cfg.DatabaseTimeout)
	lease := store.Lease{Holder: cfg.ID, For: cfg.Lease, MaxAge: cfg.MaxAge}
	var (
		source     relay.Source
		collectors []prometheus.Collector
	)
	switch cfg.Source {
	case SourceCDC:
		c := cdc.New(log, st, cdc.Config{
			DatabaseURL: cfg.CDCDatabaseURL, Slot: cfg.CDCSlot, Grace: cfg.CDCGrace, Timeout: cfg.DatabaseTimeout,
			PollEvery: cfg.PollInterval, BatchSize: cfg.BatchSize, Lease: lease,
		})
		source, collectors = c, c.Collectors()
	default:
		source = poll.New(log, st, lease, cfg.PollInterval)
	}
	transport := usershttp.New(log, usershttp.Config{
		URL: cfg.UsersURL, Token: cfg.UsersToken, Timeout: cfg.RequestTimeout, Concurrency: cfg.Concurrency,
	})
	engine := relay.New(log, st, source, transport, relay.Config{
		Lease: lease, BatchSize: cfg.BatchSize, Concurrency: cfg.Concurrency, PollInterval: cfg.PollInterval,
		MaxAttempts: cfg.MaxAttempts, BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax,
	})
	collectors = append(append(engine.Collectors(), transport.Collectors()...), collectors...)
	return &Relay{cfg: cfg, log: log, store: st, source: source, engine: engine, collectors: collectors}
}

// Run delivers until ctx ends (see relay.Engine.Run).
func (r *Relay) Run(ctx context.Context) error { return r.engine.Run(ctx) }

// Collectors returns every metric of the relay, for registering.
func (r *Relay) Collectors() []prometheus.Collector { return r.collectors }

// PurgeLoop purges delivered rows older than SENDER_DELIVERED_RETENTION
// every SENDER_PURGE_INTERVAL until ctx ends, 1,000 rows a statement. Dead
// rows are never purged: a person must look at them.
func (r *Relay) PurgeLoop(ctx context.Context) error {
	t := time.NewTicker(r.cfg.PurgeInterval)
	defer t.Stop()
	for {
		n, err := r.store.PurgeDelivered(ctx, r.cfg.DeliveredRetention, 1000)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Error("outbox purge failed", slog.String("error", err.Error()))
		case n > 0:
			r.log.Info("outbox purged", slog.Int64("rows", n), slog.Duration("retention", r.cfg.DeliveredRetention))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
