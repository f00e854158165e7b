package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// dbWork is what PostgreSQL did for a run, per student: the statements
// the services ran (pg_stat_statements' calls; BEGIN, COMMIT and other
// utility commands are not counted), the transactions committed in the
// run's two databases (read-only ones too, as an empty poll is work all
// the same) and the bytes of WAL written. CPU says what a student costs;
// these say why, in the units a change to the protocol moves. Each is -1
// when not measured: on a server not the bench's own, whose other
// sessions would count too, and statements on a server without
// pg_stat_statements.
type dbWork struct {
	statements, commits, walBytes float64
}

// unmeasured is a dbWork with nothing measured.
var unmeasured = dbWork{statements: -1, commits: -1, walBytes: -1}

// String is the work as a run's line shows it.
func (w dbWork) String() string {
	count := func(v float64) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", v)
	}
	wal := "-"
	if w.walBytes >= 0 {
		wal = fmt.Sprintf("%.1f kB", w.walBytes/1024)
	}
	return fmt.Sprintf("statements %s, commits %s, WAL %s", count(w.statements), count(w.commits), wal)
}

// medianWork is each measure's median over runs, -1 if a run did not
// measure it.
func medianWork(ws []dbWork) dbWork {
	if len(ws) == 0 {
		return unmeasured
	}
	of := func(f func(dbWork) float64) float64 {
		xs := make([]float64, len(ws))
		for i, w := range ws {
			if xs[i] = f(w); xs[i] < 0 {
				return -1
			}
		}
		return median(xs)
	}
	return dbWork{
		statements: of(func(w dbWork) float64 { return w.statements }),
		commits:    of(func(w dbWork) float64 { return w.commits }),
		walBytes:   of(func(w dbWork) float64 { return w.walBytes }),
	}
}

// trackStatements has the bench's own cluster count statements with
// pg_stat_statements, if the server has the module, as it does in
// Debian's server package: the library must be loaded at start, so this
// is an ALTER SYSTEM statement for setAndRestart, "" when the module is
// missing (the statements are then not measured).
func trackStatements(ctx context.Context, server string) (string, error) {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", fmt.Errorf("configure PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var available bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_stat_statements')").Scan(&available); err != nil {
		return "", fmt.Errorf("configure PostgreSQL: %w", err)
	}
	if !available {
		return "", nil
	}
	return "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'", nil
}

// enableStatements makes the view readable once the library is loaded,
// and leaves utility commands out of its counts, so that a statement is
// a query, not a BEGIN or a COMMIT (commits are counted on their own).
// It says whether statements are counted.
func enableStatements(ctx context.Context, server string) (bool, error) {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return false, fmt.Errorf("configure PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var loaded bool
	if err := conn.QueryRow(ctx, "SELECT current_setting('shared_preload_libraries') LIKE '%pg_stat_statements%'").Scan(&loaded); err != nil {
		return false, fmt.Errorf("configure PostgreSQL: %w", err)
	}
	if !loaded {
		return false, nil
	}
	for _, statement := range []string{
		"CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
		"ALTER SYSTEM SET pg_stat_statements.track_utility = off",
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, statement); err != nil {
			return false, fmt.Errorf("configure PostgreSQL: %s: %w", statement, err)
		}
	}
	return true, nil
}

// workSince starts counting d's work. The function it returns ends the
// count for students students; call it after the services have been
// stopped: a session's commits reach pg_stat_database when it ends, or up
// to ten seconds after it goes idle, so it first waits for every session
// in the two databases but the bench's own to be gone.
//
// The bench's own sessions read those databases while the count runs (to
// watch for links): their statements are left out by role, and their
// commits, one per statement, by that count. Their commits may reach the
// view up to a second late, which is a few in a burndown's thousands.
func (b *bench) workSince(ctx context.Context, d *databases) (func(ctx context.Context, students int) (dbWork, error), error) {
	if b.postmaster == 0 {
		return func(context.Context, int) (dbWork, error) { return unmeasured, nil }, nil
	}
	names := []string{d.student, d.users}
	conn, err := pgx.Connect(ctx, b.server.String())
	if err != nil {
		return nil, fmt.Errorf("count work: %w", err)
	}
	closeConn := func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	if b.statements {
		// From nothing: the run's databases are new, and a reset keeps the
		// view's entries few (it evicts when full, which would lose calls).
		if _, err := conn.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			closeConn()
			return nil, fmt.Errorf("count work: %w", err)
		}
	}
	before, err := readWork(ctx, conn, names, b.statements)
	if err != nil {
		closeConn()
		return nil, err
	}
	return func(ctx context.Context, students int) (dbWork, error) {
		defer closeConn()
		if err := waitSessionsGone(ctx, conn, names); err != nil {
			return dbWork{}, err
		}
		after, err := readWork(ctx, conn, names, b.statements)
		if err != nil {
			return dbWork{}, err
		}
		n := float64(students)
		w := dbWork{
			statements: -1,
			commits:    (after.commits - before.commits - (after.benchStatements - before.benchStatements)) / n,
			walBytes:   (after.wal - before.wal) / n,
		}
		if b.statements {
			w.statements = (after.statements - before.statements) / n
		} else {
			// Without the view the bench's own commits cannot be told
			// apart: they stay in, one per 50 ms poll.
			w.commits = (after.commits - before.commits) / n
		}
		return w, nil
	}, nil
}

// workCounts are the server's counters at one moment.
type workCounts struct {
	commits, wal                float64
	statements, benchStatements float64
}

func readWork(ctx context.Context, conn *pgx.Conn, names []string, statements bool) (workCounts, error) {
	var c workCounts
	if err := conn.QueryRow(ctx, `
		SELECT (SELECT COALESCE(sum(xact_commit), 0)::float8 FROM pg_stat_database WHERE datname = ANY($1)),
		       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8`, names).Scan(&c.commits, &c.wal); err != nil {
		return workCounts{}, fmt.Errorf("count work: %w", err)
	}
	if !statements {
		return c, nil
	}
	if err := conn.QueryRow(ctx, `
		SELECT COALESCE(sum(s.calls) FILTER (WHERE s.userid <> r.oid), 0)::float8,
		       COALESCE(sum(s.calls) FILTER (WHERE s.userid = r.oid), 0)::float8
		FROM pg_stat_statements s
		JOIN pg_database d ON d.oid = s.dbid
		CROSS JOIN (SELECT oid FROM pg_roles WHERE rolname = current_user) r
		WHERE d.datname = ANY($1)`, names).Scan(&c.statements, &c.benchStatements); err != nil {
		return workCounts{}, fmt.Errorf("count work: %w", err)
	}
	return c, nil
}

// waitSessionsGone waits until no session of another role than the
// bench's is connected to the named databases.
func waitSessionsGone(ctx context.Context, conn *pgx.Conn, names []string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var open int
		if err := conn.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = ANY($1) AND usename <> current_user`, names).Scan(&open); err != nil {
			return fmt.Errorf("count work: %w", err)
		}
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("count work: %d sessions of the services still open 10s after they stopped", open)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
