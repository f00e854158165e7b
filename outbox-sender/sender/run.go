// Package sender is the outbox-sender binary put together: its
// configuration (SENDER_*), the one place SENDER_SOURCE is decided, and
// Run, which wires the store, the source of new rows, the transport to Users
// and the delivery engine, beside an admin port and the purge of delivered
// rows. The parts live in packages of their own:
//
//	relay       the delivery engine: claim → deliver → judge → record
//	poll, cdc   where new rows come from (SENDER_SOURCE)
//	usershttp   how a row reaches Users: POST /users with its key
//	usersnats   or a command on a JetStream stream, answered on another (SENDER_TRANSPORT)
//	answer      what Users' answer means, the same to either transport
//	deadletter  the operator's tools: the admin API's routes and "dead"
//	internal/store  every statement the sender runs
//
// The tests of this package run the whole relay against a real PostgreSQL
// and a stand-in Users.
package sender

import (
	"context"
	"io"
	"log/slog"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/outbox-sender/usershttp"
)

// Run runs the sender until ctx ends: the delivery engine, the purge of old
// delivered rows, and an admin HTTP server with /healthz, /readyz, /metrics
// and the dead-letter routes. args may be "healthcheck", or "dead ..." (see
// package deadletter); the sender has no migrations of its own (Student's
// are applied by "student migrate").
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, e, _ := LoadConfig(getenv)
	if len(args) > 0 && args[0] == "provision-broker" {
		e.Require("SENDER_NATS_ADMIN_PASSWORD", getenv("SENDER_NATS_ADMIN_PASSWORD")+getenv("SENDER_NATS_ADMIN_PASSWORD_FILE"),
			"creating streams and consumers takes the broker's admin user ("+cfg.NATSAdminUser+"); give its password")
		if err := e.Err(); err != nil {
			return err
		}
		return provisionBroker(ctx, cfg, stdout)
	}
	switch {
	case len(args) > 0:
		// "dead" and "healthcheck" never call Users, so an operator's
		// shell needs no credentials for it.
	case cfg.Transport == TransportNATS:
		e.Require("SENDER_NATS_PASSWORD", getenv("SENDER_NATS_PASSWORD")+getenv("SENDER_NATS_PASSWORD_FILE"),
			"the broker lets the sender's NATS user ("+natsbus.SenderUser+") publish commands and read replies; give its password")
	default:
		e.Require("SENDER_USERS_TOKEN", getenv("SENDER_USERS_TOKEN")+getenv("SENDER_USERS_TOKEN_FILE"),
			"Users answers authenticated callers only; give the token Users lists for the sender in USERS_API_TOKENS")
	}
	if err := e.Err(); err != nil {
		return err
	}
	return service.Binary{
		Name: "outbox-sender", DatabaseURL: cfg.DatabaseURL, LogLevel: cfg.LogLevel, HealthAddr: cfg.AdminAddr,
		DatabaseTimeout: cfg.DatabaseTimeout,
		MaxConns:        int32(cfg.DBMaxConns),      //nolint:gosec // at most 1000 (config.go)
		AdminMaxConns:   int32(cfg.AdminDBMaxConns), //nolint:gosec // at most 100 (config.go)
		Commands:        map[string]service.Command{"dead": deadletter.Command(cfg.DatabaseTimeout, cfg.MaxRedrives, cfg.KeyWindow())},
		Start: func(log *slog.Logger, pools service.Pools) []service.Part {
			pool := pools.Main
			log = log.With(slog.String("sender_id", cfg.ID))
			r := New(log, pool, cfg)
			// Durations as Go writes them ("30s"): slog's JSON would print
			// nanoseconds.
			to := slog.String("users_url", usershttp.Redacted(cfg.UsersURL))
			if cfg.Transport == TransportNATS {
				to = slog.String("nats_url", natsbus.Redacted(cfg.NATSURL))
			}
			log.Info("sender starting", slog.String("sender_source", cfg.Source), slog.String("sender_transport", cfg.Transport),
				slog.String("database", database.Where(cfg.DatabaseURL)), to,
				slog.Int("batch_size", cfg.BatchSize), slog.Int("concurrency", cfg.Concurrency),
				slog.String("lease", cfg.Lease.String()), slog.String("poll_interval", cfg.PollInterval.String()),
				slog.Int("admin_operators", len(cfg.Operators)))
			if len(cfg.Operators) == 0 {
				log.Info("the admin port's outbox routes refuse every request: SENDER_ADMIN_TOKENS lists no operator")
			}
			if main, cdc := database.Where(cfg.DatabaseURL), database.Where(cfg.CDCDatabaseURL); cfg.Source == SourceCDC && main != cdc {
				// Both must be Student's database; a default left in place
				// when only one was moved points the stream elsewhere.
				log.Warn("SENDER_CDC_DATABASE_URL and SENDER_DATABASE_URL name different databases: both must be Student's",
					slog.String("database", main), slog.String("cdc_database", cdc))
			}
			return []service.Part{
				{Name: "delivery", Run: r.Run},
				{Name: "outbox purge", Run: r.PurgeLoop},
				// Without its admin port the sender is unobservable: if the
				// server fails, the whole process stops.
				service.Server(log, "admin", "SENDER_ADMIN_ADDR", cfg.AdminAddr, cfg.AdminMaxConns, adminRouter(log, pools.Admin, r)),
			}
		},
	}.Run(ctx, args, stdout)
}

// adminRouter is the admin listener's router: /healthz, /readyz, /metrics
// and the operator's outbox routes. pool is the admin port's own (Config
// AdminDBMaxConns): readiness and the operator's routes wait for its
// connections, never for delivery's.
func adminRouter(log *slog.Logger, pool *pgxpool.Pool, r *Relay) chi.Router {
	ready := func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return err
		}
		return r.Ready()
	}
	admin := httpapi.NewAdminRouter(log, ready, "SENDER_ADMIN_ALLOWED_HOSTS", r.cfg.AdminAllowedHosts)
	op := deadletter.New(pool, "admin-api@"+r.cfg.ID, r.cfg.DatabaseTimeout)
	op.MaxRedrives = r.cfg.MaxRedrives
	op.KeyWindow = r.cfg.KeyWindow()
	// A scrape never fails whole: the outbox's figures leave themselves
	// out while the database is down, and MetricsRoute covers any other
	// collector that fails.
	httpapi.MetricsRoute(admin, log, httpapi.NewRegistry(append(r.Collectors(), op.Collectors()...)...))
	deadletter.Routes(admin, op, auth.NewTokens(r.cfg.Operators))
	return admin
}
