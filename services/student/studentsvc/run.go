package studentsvc

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/web"
)

// Run runs Student until ctx ends. args may be ["migrate"], which applies
// Student' migrations and returns.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, _, err := LoadConfig(getenv)
	if err != nil {
		return err
	}
	log, err := web.NewLogger(stdout, cfg.LogLevel)
	if err != nil {
		return err
	}
	log = log.With(slog.String("service", "student"))
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()
	if migrate, err := web.MigrateArg(args); err != nil || migrate {
		if err != nil {
			return err
		}
		return migrations.Up(ctx, pool, migrations.Student)
	}

	s := NewServer(log, pool, cfg)
	purgeCtx, stopPurge := context.WithCancel(ctx)
	purged := make(chan struct{})
	go func() {
		defer close(purged)
		s.inbox.PurgeLoop(purgeCtx, log, cfg.InboxRetention, cfg.PurgeInterval)
	}()
	defer func() { stopPurge(); <-purged }()
	if err := web.ListenAndServe(ctx, log, cfg.HTTPAddr, s.Routes()); err != nil {
		return fmt.Errorf("STUDENT_HTTP_ADDR=%s: %w", cfg.HTTPAddr, err)
	}
	return nil
}
