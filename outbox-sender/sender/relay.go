package sender

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/outbox-sender/cdc"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/poll"
	"github.com/outboxref/outboxref/outbox-sender/relay"
	"github.com/outboxref/outboxref/outbox-sender/usershttp"
	"github.com/outboxref/outboxref/outbox-sender/usersnats"
)

// Relay is the sender's delivery put together: the engine, fed by the
// source SENDER_SOURCE names, delivering through the transport
// SENDER_TRANSPORT names, recording in Student's database.
type Relay struct {
	cfg        Config
	log        *slog.Logger
	store      *store.Store
	source     relay.Source
	engine     *relay.Engine
	collectors []prometheus.Collector
	// broker is the NATS transport, whose replies Run reads beside the
	// engine; nil with HTTP.
	broker *usersnats.Transport
	// err is why the relay could not be put together; Run returns it.
	err error
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
	r := &Relay{cfg: cfg, log: log, store: st, source: source}
	var transport relay.Transport
	switch cfg.Transport {
	case TransportNATS:
		t, err := usersnats.New(log, usersnats.Config{
			NATS:    natsbus.Config{URL: cfg.NATSURL, User: natsbus.SenderUser, Password: cfg.NATSPassword, Name: "outbox-sender " + cfg.ID},
			Timeout: cfg.RequestTimeout, AnswerWait: cfg.NATSAnswerWait, Workers: recordWorkers,
		})
		if err != nil {
			r.err = err
			return r
		}
		r.broker, transport = t, t
		collectors = append(collectors, t.Collectors()...)
	default:
		t := usershttp.New(log, usershttp.Config{
			URL: cfg.UsersURL, Token: cfg.UsersToken, Timeout: cfg.RequestTimeout, Concurrency: cfg.Concurrency,
		})
		transport = t
		collectors = append(collectors, t.Collectors()...)
	}
	r.engine = relay.New(log, st, source, transport, relay.Config{
		Lease: lease, BatchSize: cfg.BatchSize, Concurrency: cfg.Concurrency, PollInterval: cfg.PollInterval,
		MaxAttempts: cfg.MaxAttempts, BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax,
	})
	r.collectors = append(r.engine.Collectors(), collectors...)
	return r
}

// Ready is nil unless the transport cannot do its work by itself: with the
// broker, a login the broker refuses. (Users or a broker that is down is
// not: rows wait in the outbox, and delivery resumes when it is back.)
func (r *Relay) Ready() error {
	if r.broker == nil {
		return nil
	}
	if err := r.broker.Ready(); err != nil {
		return &httpapi.NotReadyError{Dependency: "broker",
			Says: "the broker refuses the sender's NATS login (user " + natsbus.SenderUser + "): check SENDER_NATS_PASSWORD", Err: err}
	}
	return nil
}

// recordWorkers is how many batches of Users' replies the NATS transport
// records at once, as many as the engine's recorders.
const recordWorkers = 4

// Run delivers until ctx ends (see relay.Engine.Run). With the broker, it
// reads Users' replies beside the engine until ctx ends too, and returns
// once both have finished what they hold.
func (r *Relay) Run(ctx context.Context) error {
	if r.err != nil {
		return r.err
	}
	if r.broker == nil {
		return r.engine.Run(ctx)
	}
	defer r.broker.Close()
	var replies sync.WaitGroup
	var repliesErr error
	replies.Go(func() { repliesErr = r.broker.Replies(ctx, r.engine) })
	err := r.engine.Run(ctx)
	replies.Wait()
	return errors.Join(err, repliesErr)
}

// Collectors returns every metric of the relay, for registering.
func (r *Relay) Collectors() []prometheus.Collector { return r.collectors }

// PurgeLoop purges delivered rows older than SENDER_DELIVERED_RETENTION
// (and replies received as long ago), and parked replies older than
// SENDER_PARKED_RETENTION, every SENDER_PURGE_INTERVAL until ctx ends,
// 1,000 rows a statement. Dead rows are never purged: a person must look
// at them.
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
		// The inbox of replies keeps what the broker may still deliver
		// again: an acked reply is not delivered again to the same durable
		// consumer, but Users' relay publishes an answer again when it
		// could not mark it published, and a re-created consumer reads the
		// stream (7 days) from its start, so the retention must outlast the
		// stream's.
		if n, err := r.store.PurgeReplies(ctx, r.cfg.DeliveredRetention, 1000); err != nil && ctx.Err() == nil {
			r.log.Error("reply inbox purge failed", slog.String("error", err.Error()))
		} else if n > 0 {
			r.log.Info("reply inbox purged", slog.Int64("rows", n), slog.Duration("retention", r.cfg.DeliveredRetention))
		}
		if n, err := r.store.PurgeParked(ctx, r.cfg.ParkedRetention, 1000); err != nil && ctx.Err() == nil {
			r.log.Error("parked replies purge failed", slog.String("error", err.Error()))
		} else if n > 0 {
			r.log.Info("parked replies purged", slog.Int64("rows", n), slog.Duration("retention", r.cfg.ParkedRetention))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
