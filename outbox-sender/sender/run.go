package sender

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxref/outboxref/internal/web"
)

// Main runs the sender until ctx ends: the delivery loop, and a small admin
// HTTP server with /healthz, /readyz and /metrics.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unknown arguments %q: the sender takes none (Student's migrations are applied by \"student migrate\")", args)
	}
	cfg, _, err := LoadConfig(getenv)
	if err != nil {
		return err
	}
	log, err := web.NewLogger(stdout, cfg.LogLevel)
	if err != nil {
		return err
	}
	log = log.With(slog.String("service", "outbox-sender"), slog.String("sender_id", cfg.ID))
	poolCfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("SENDER_DATABASE_URL: %w", err)
	}
	// The claimer, the completer and readiness checks are the only users;
	// a few connections are plenty whatever the delivery concurrency.
	poolCfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()

	s := New(log, pool, cfg)
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collectors()...)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	admin := web.NewRouter(log, pool.Ping)
	admin.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	adminErr := make(chan error, 1)
	go func() {
		err := web.ListenAndServe(ctx, log, cfg.AdminAddr, admin)
		if err != nil {
			cancel() // without its admin port the sender is unobservable: stop
		}
		adminErr <- err
	}()

	log.Info("sender starting", slog.String("users_url", cfg.UsersURL), slog.Int("batch_size", cfg.BatchSize),
		slog.Int("concurrency", cfg.Concurrency), slog.Duration("lease", cfg.Lease))
	runErr := s.Run(ctx)
	if err := <-adminErr; err != nil {
		return fmt.Errorf("SENDER_ADMIN_ADDR=%s: %w", cfg.AdminAddr, err)
	}
	return runErr
}
