package studentsvc

import (
	"context"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/services/student/internal/store"
)

// Run runs Student until ctx ends: the API, the admin listener (/metrics,
// /healthz, /readyz), the loop that purges expired client keys, and the one
// that wakes the outbox sender for new rows. args may be "migrate" or
// "healthcheck" (see service.Binary).
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, e, _ := LoadConfig(getenv)
	if len(args) == 0 {
		// As Users: serving needs callers. Student's API shows every
		// student's email and document number; nothing is served to no one.
		e.Require("STUDENT_API_TOKENS", getenv("STUDENT_API_TOKENS")+getenv("STUDENT_API_TOKENS_FILE"),
			"Student answers authenticated callers only; list each as caller:token")
	}
	if err := e.Err(); err != nil {
		return err
	}
	return service.Binary{
		Name: "student", Migrations: migrations.Student, DatabaseURL: cfg.DatabaseURL,
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
			wake := func(ctx context.Context) error {
				s.store.Wake.Run(ctx, log)
				return nil
			}
			return []service.Part{
				service.Server(log, "api", "STUDENT_HTTP_ADDR", cfg.HTTPAddr, cfg.HTTPMaxConns, s.Routes()),
				service.Server(log, "admin", "STUDENT_ADMIN_ADDR", cfg.AdminAddr, cfg.AdminMaxConns, s.AdminRoutes()),
				{Name: "inbox purge", Run: purge},
				{Name: "outbox wake-up", Run: wake},
			}
		},
	}.Run(ctx, args, stdout)
}

// NewServer returns a Server on pool's database. The handlers see only the
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
