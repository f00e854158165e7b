package sender

import (
	"context"
	"io"
	"log/slog"
	"net/url"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/service"
)

// Run runs the sender until ctx ends: the delivery loop, the purge of old
// delivered rows, and an admin HTTP server with /healthz, /readyz, /metrics
// and the dead-letter routes (admin.go). args may be "healthcheck", or
// "dead ..." (commands.go); the sender has no migrations of its own
// (Student's are applied by "student migrate").
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, e, _ := LoadConfig(getenv)
	if len(args) == 0 {
		// Delivering needs the token; "dead" and "healthcheck" never call
		// Users, so an operator's shell does not need it.
		e.Require("SENDER_USERS_TOKEN", getenv("SENDER_USERS_TOKEN")+getenv("SENDER_USERS_TOKEN_FILE"),
			"Users answers authenticated callers only; give the token Users lists for the sender in USERS_API_TOKENS")
	}
	if err := e.Err(); err != nil {
		return err
	}
	return service.Binary{
		Name: "outbox-sender", DatabaseURL: cfg.DatabaseURL, LogLevel: cfg.LogLevel, HealthAddr: cfg.AdminAddr,
		DatabaseTimeout: cfg.DatabaseTimeout,
		MaxConns:        int32(cfg.DBMaxConns), //nolint:gosec // at most 1000 (config.go)
		Commands:        map[string]service.Command{"dead": deadCommand(cliActor(), cfg.DatabaseTimeout)},
		Start: func(log *slog.Logger, pool *pgxpool.Pool) []service.Part {
			log = log.With(slog.String("sender_id", cfg.ID))
			s := New(log, pool, cfg)
			admin := adminRouter(log, pool, s, cfg)

			log.Info("sender starting", slog.String("users_url", redacted(cfg.UsersURL)), slog.Int("batch_size", cfg.BatchSize),
				slog.Int("concurrency", cfg.Concurrency), slog.Duration("lease", cfg.Lease))
			return []service.Part{
				{Name: "delivery", Run: s.Run},
				{Name: "outbox purge", Run: s.PurgeLoop},
				// Without its admin port the sender is unobservable: if the
				// server fails, the whole process stops.
				service.Server(log, "SENDER_ADMIN_ADDR", cfg.AdminAddr, cfg.AdminMaxConns, admin),
			}
		},
	}.Run(ctx, args, stdout)
}

// adminRouter is the admin listener's router: /healthz, /readyz, /metrics
// and the operator's outbox routes.
func adminRouter(log *slog.Logger, pool *pgxpool.Pool, s *Sender, cfg Config) chi.Router {
	admin := httpapi.NewRouter(log, pool.Ping)
	// A scrape never fails whole: the outbox's figures leave themselves
	// out while the database is down (outboxCollector), and MetricsRoute
	// covers any other collector that fails.
	httpapi.MetricsRoute(admin, log, httpapi.NewRegistry(s.Collectors()...))
	AdminRoutes(admin, NewOperator(pool, "admin-api@"+cfg.ID, cfg.DatabaseTimeout))
	return admin
}

// redacted is u with any password in it masked: the address of Users is
// worth a log line, a password someone put in it is not.
func redacted(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparsable)"
	}
	return parsed.Redacted()
}
