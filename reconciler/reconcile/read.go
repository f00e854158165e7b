package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/database"
)

// ReadStats are what a pass asked of one database: the measure of the load
// it put there.
type ReadStats struct {
	Rows       int `json:"rows"`
	Statements int `json:"statements"`
	// Longest is the longest statement, as the reconciler timed it (the
	// round trip included).
	Longest time.Duration `json:"-"`
	// LongestSeconds is Longest, for the JSON report.
	LongestSeconds float64 `json:"longest_statement_seconds"`
}

func (s *ReadStats) note(rows int, took time.Duration) {
	s.Rows += rows
	s.Statements++
	if took > s.Longest {
		s.Longest = took
		s.LongestSeconds = took.Seconds()
	}
}

// openPool opens a small pool on dbURL as the reconciler: one statement at
// a time is all it runs. Every statement is bounded by the server's
// statement_timeout, and, should the role's read-only default have been
// changed by hand, every transaction is read-only all the same.
func openPool(ctx context.Context, dbURL string, statementTimeout time.Duration) (*pgxpool.Pool, error) {
	cfg, err := database.Config(dbURL, database.Limits{MaxConns: 2, StatementTimeout: statementTimeout})
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	// Who it is, in pg_stat_activity.
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "reconciler"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	return pool, nil
}

// read runs one statement, f, on a database whose stats are s, and counts
// its rows and time. The server's statement_timeout bounds the statement;
// the deadline here, a little longer, bounds a connection that stopped
// answering. what names the statement in an error.
func read[T any](ctx context.Context, s *ReadStats, timeout time.Duration, what string, f func(context.Context) ([]T, error)) ([]T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	start := time.Now()
	rows, err := f(ctx)
	s.note(len(rows), time.Since(start))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, database.Classify(err))
	}
	return rows, nil
}

// one is read for a statement that returns one row.
func one[T any](ctx context.Context, s *ReadStats, timeout time.Duration, what string, f func(context.Context) (T, error)) (T, error) {
	rows, err := read(ctx, s, timeout, what, func(ctx context.Context) ([]T, error) {
		v, err := f(ctx)
		return []T{v}, err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return rows[0], nil
}

// pause waits d between pages, so that a pass leaves the databases to the
// services in between; it returns early, with the context's error, when
// ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errNotChecked marks an error that kept a pass from finishing: the
// databases could not be read, or not in time. Exit status 2.
var errNotChecked = errors.New("could not check")
