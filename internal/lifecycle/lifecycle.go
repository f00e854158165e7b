// Package lifecycle owns the life of an HTTP service process, the part
// Student and Users share between main and their handlers: logger, database
// pool, the "migrate" subcommand, background loops beside the server, and a
// graceful stop when the context ends.
package lifecycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/web"
)

// Service describes one service binary.
type Service struct {
	Name        string // for logs: "student", "users"
	Migrations  migrations.Set
	DatabaseURL string
	HTTPAddr    string
	AddrVar     string // the variable HTTPAddr came from, for error messages
	LogLevel    string
	// Start builds the handler and the background loops that run beside
	// it; each loop must return when its context ends.
	Start func(log *slog.Logger, pool *pgxpool.Pool) (http.Handler, []func(context.Context))
}

// Run serves until ctx ends. With args ["migrate"] it applies the service's
// migrations and returns instead.
func (s Service) Run(ctx context.Context, args []string, stdout io.Writer) error {
	migrate := false
	switch {
	case len(args) == 1 && args[0] == "migrate":
		migrate = true
	case len(args) > 0:
		return fmt.Errorf("unknown arguments %q: want none, or \"migrate\"", args)
	}
	log, err := web.NewLogger(stdout, s.LogLevel)
	if err != nil {
		return err
	}
	log = log.With(slog.String("service", s.Name))
	pool, err := pgxpool.New(ctx, s.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()
	if migrate {
		if err := migrations.Up(ctx, pool, s.Migrations); err != nil {
			return err
		}
		log.Info("migrations applied")
		return nil
	}

	handler, loops := s.Start(log, pool)
	loopCtx, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, loop := range loops {
		wg.Go(func() { loop(loopCtx) })
	}
	defer func() { stopLoops(); wg.Wait() }()
	if err := web.ListenAndServe(ctx, log, s.HTTPAddr, handler); err != nil {
		return fmt.Errorf("%s=%s: %w", s.AddrVar, s.HTTPAddr, err)
	}
	return nil
}
