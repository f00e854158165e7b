// Command bench measures the outbox sender's end-to-end throughput:
// rows claimed, delivered to an in-process Users on its own database, and
// recorded on their students. It runs the sender as configured by default
// side by side with its baseline, a one-row-at-a-time relay (batch 1,
// concurrency 1), in interleaved rounds, and prints each round and the
// medians. Run it with `make bench`, which supplies a throwaway PostgreSQL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/users/usersvc"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// variant is one sender configuration under test.
type variant struct {
	name               string
	batch, concurrency int
}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("benchsender", flag.ContinueOnError)
	rows := fs.Int("rows", 2000, "outbox rows per round")
	rounds := fs.Int("rounds", 5, "rounds per variant, interleaved")
	if err := fs.Parse(args); err != nil {
		return err
	}
	server := getenv("TEST_DATABASE_URL")
	if server == "" {
		return errors.New("TEST_DATABASE_URL is not set: run `make bench`, which starts a throwaway PostgreSQL")
	}
	variants := []variant{
		{name: "baseline: one row at a time (batch 1, concurrency 1)", batch: 1, concurrency: 1},
		{name: "default (batch 100, concurrency 32)", batch: 100, concurrency: 32},
	}
	fmt.Fprintf(out, "outbox sender throughput: %d rows per round, %d rounds, variants interleaved\n", *rows, *rounds)
	results := make([][]float64, len(variants))
	for r := 1; r <= *rounds; r++ {
		for i, v := range variants {
			rate, err := measure(ctx, server, v, *rows, fmt.Sprintf("r%d_v%d", r, i))
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r, v.name, err)
			}
			results[i] = append(results[i], rate)
			fmt.Fprintf(out, "round %d  %-55s %8.0f rows/s\n", r, v.name, rate)
		}
	}
	fmt.Fprintln(out, "\nmedians")
	base := median(results[0])
	for i, v := range variants {
		m := median(results[i])
		fmt.Fprintf(out, "  %-55s %8.0f rows/s  %5.1fx baseline\n", v.name, m, m/base)
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// measure seeds rows outbox rows on fresh databases, runs the sender until
// every row is delivered, and returns rows per second.
func measure(ctx context.Context, server string, v variant, rows int, tag string) (float64, error) {
	quiet := slog.New(slog.DiscardHandler)
	studentPool, dropStudent, err := freshDB(ctx, server, "bench_student_"+tag, migrations.Student)
	if err != nil {
		return 0, err
	}
	defer dropStudent()
	usersPool, dropUsers, err := freshDB(ctx, server, "bench_users_"+tag, migrations.Users)
	if err != nil {
		return 0, err
	}
	defer dropUsers()

	const token = "bench-sender-token-0123456789"
	users := httptest.NewServer(usersvc.NewServer(quiet, usersPool, usersvc.Config{
		Callers: []auth.Credential{{Caller: "outbox-sender", Token: token}},
	}).Routes())
	defer users.Close()

	if _, err := studentPool.Exec(ctx, `
		WITH s AS (
			INSERT INTO students (id, name, email, document_number)
			SELECT gen_random_uuid(), 'Student ' || i, 's' || i || '@example.com', 'doc-' || i
			FROM generate_series(1, $1) AS i
			RETURNING id, name, email, document_number)
		INSERT INTO outbox (idempotency_key, operation, student_id, payload)
		SELECT gen_random_uuid(), 'create-user', id,
		       jsonb_build_object('name', name, 'email', email, 'document_number', document_number)
		FROM s`, rows); err != nil {
		return 0, fmt.Errorf("seed: %w", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- sender.New(quiet, studentPool, sender.Config{
			UsersURL: users.URL, UsersToken: token, ID: "bench-" + uuid.NewString()[:8],
			BatchSize: v.batch, Concurrency: v.concurrency, PollInterval: 5 * time.Millisecond,
			Lease: time.Minute, RequestTimeout: 10 * time.Second, MaxAttempts: 1000,
			BackoffMin: 10 * time.Millisecond, BackoffMax: time.Second, MaxAge: time.Hour,
		}).Run(runCtx)
	}()
	var delivered int
	for delivered < rows {
		if err := ctx.Err(); err != nil {
			cancel()
			return 0, err
		}
		time.Sleep(5 * time.Millisecond)
		if err := studentPool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE state = 'delivered'").Scan(&delivered); err != nil {
			cancel()
			return 0, fmt.Errorf("count delivered: %w", err)
		}
		if time.Since(start) > 5*time.Minute {
			cancel()
			return 0, fmt.Errorf("only %d of %d rows delivered after 5 minutes", delivered, rows)
		}
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	var linked int
	if err := studentPool.QueryRow(ctx, "SELECT count(DISTINCT user_id) FROM students").Scan(&linked); err != nil {
		return 0, err
	}
	if linked != rows {
		return 0, fmt.Errorf("%d distinct users linked, want %d", linked, rows)
	}
	return float64(rows) / elapsed.Seconds(), nil
}

// freshDB creates a database on server, applies set's migrations and
// returns a pool and a function that drops it again.
func freshDB(ctx context.Context, server, name string, set migrations.Set) (*pgxpool.Pool, func(), error) {
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	defer admin.Close(ctx)
	ident := pgx.Identifier{strings.ToLower(name)}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident); err != nil {
		return nil, nil, fmt.Errorf("drop database: %w", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return nil, nil, fmt.Errorf("create database: %w", err)
	}
	u, err := url.Parse(server)
	if err != nil {
		return nil, nil, err
	}
	u.Path = "/" + strings.ToLower(name)
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	// The tests' passwords: roles belong to the whole server, which the
	// tests may be using too.
	if err := migrations.Migrate(ctx, cfg.ConnConfig, set, pgtest.Passwords); err != nil {
		pool.Close()
		return nil, nil, err
	}
	drop := func() {
		pool.Close()
		c, err := pgx.Connect(context.Background(), server)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	}
	return pool, drop, nil
}
