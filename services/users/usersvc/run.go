package usersvc

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/services/users/internal/store"
)

// Run runs Users until ctx ends: the API, the admin listener (/metrics,
// /healthz, /readyz), the loops that purge expired inbox rows and
// published answers, and with USERS_NATS_URL the broker's consumer of
// commands and relay of answers. args may
// be "migrate" or "healthcheck" (see service.Binary).
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, e, _ := LoadConfig(getenv)
	if len(args) == 0 {
		// Serving needs callers, and nothing is served to no one: secure by
		// default. "migrate" and "healthcheck" answer no caller, so a
		// migration job is not handed the API's tokens.
		e.Require("USERS_API_TOKENS", getenv("USERS_API_TOKENS")+getenv("USERS_API_TOKENS_FILE"),
			"Users answers authenticated callers only; list each as caller:token")
	}
	if err := e.Err(); err != nil {
		return err
	}
	return service.Binary{
		Name: "users", Migrations: migrations.Users, DatabaseURL: cfg.DatabaseURL,
		MigrateDatabaseURL: cfg.MigrateDatabaseURL, Logins: cfg.Logins,
		DatabaseTimeout: cfg.DatabaseTimeout, LogLevel: cfg.LogLevel, HealthAddr: cfg.HTTPAddr,
		MaxConns: int32(cfg.DBMaxConns), //nolint:gosec // at most 1000 (config.go)
		Start: func(log *slog.Logger, pools service.Pools) []service.Part {
			pool := pools.Main
			s := NewServer(log, pool, cfg)
			purge := func(ctx context.Context) error {
				s.store.Inbox.PurgeLoop(ctx, log, cfg.InboxRetention, cfg.PurgeInterval)
				return nil
			}
			parts := []service.Part{
				service.Server(log, "api", "USERS_HTTP_ADDR", cfg.HTTPAddr, cfg.HTTPMaxConns, s.Routes()),
				service.Server(log, "admin", "USERS_ADMIN_ADDR", cfg.AdminAddr, cfg.AdminMaxConns, s.AdminRoutes()),
				{Name: "inbox purge", Run: purge},
				{Name: "answer and parked command purge", Run: func(ctx context.Context) error {
					s.purgeAnswers(ctx, cfg.InboxRetention, cfg.ParkedRetention, cfg.PurgeInterval)
					return nil
				}},
			}
			if cfg.NATSURL != "" {
				parts = append(parts, newBroker(s, cfg, brokerConn(cfg)).part())
			}
			return parts
		},
	}.Run(ctx, args, stdout)
}

// NewServer returns a Server on pool's database, answering cfg.Callers
// (with none, it refuses every API request). The handlers see only the
// store built here, never the pool.
func NewServer(log *slog.Logger, pool *pgxpool.Pool, cfg Config) *Server {
	m := newMetrics()
	reg := httpapi.NewRegistry(m.collectors()...)
	return &Server{
		log: log, store: store.New(pool, cfg.KeyWait, cfg.DatabaseTimeout), auth: auth.NewTokens(cfg.Callers),
		metrics: m, registry: reg, observe: httpapi.RequestMetrics(reg),
		adminHosts: cfg.AdminAllowedHosts,
	}
}

// purgeAnswers deletes published answers older than retention, and
// parked commands older than parkedRetention, every interval until ctx
// ends: an answer is kept as long as the key it answers is remembered, a
// parked command as long as a person may still want to read it.
func (s *Server) purgeAnswers(ctx context.Context, retention, parkedRetention, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := s.store.PurgeAnswers(ctx, retention, 1000)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Error("answer purge failed", slog.String("error", err.Error()))
		case n > 0:
			s.log.Info("answers purged", slog.Int64("rows", n), slog.Duration("retention", retention))
		}
		n, err = s.store.PurgeParked(ctx, parkedRetention, 1000)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Error("parked commands purge failed", slog.String("error", err.Error()))
		case n > 0:
			s.log.Info("parked commands purged", slog.Int64("rows", n), slog.Duration("retention", parkedRetention))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
