package usersvc

import (
	"context"
	"io"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/lifecycle"
)

// Run runs Users until ctx ends: the API and the inbox purge loop. With
// args ["migrate"] it applies Users' migrations and returns.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, _, err := LoadConfig(getenv)
	if err != nil {
		return err
	}
	return lifecycle.Service{
		Name: "users", Migrations: migrations.Users, DatabaseURL: cfg.DatabaseURL,
		HTTPAddr: cfg.HTTPAddr, AddrVar: "USERS_HTTP_ADDR", LogLevel: cfg.LogLevel,
		Start: func(log *slog.Logger, pool *pgxpool.Pool) (http.Handler, []func(context.Context)) {
			s := NewServer(log, pool, cfg)
			purge := func(ctx context.Context) { s.inbox.PurgeLoop(ctx, log, cfg.InboxRetention, cfg.PurgeInterval) }
			return s.Routes(), []func(context.Context){purge}
		},
	}.Run(ctx, args, stdout)
}
