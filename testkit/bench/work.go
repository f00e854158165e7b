package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// medianWork is each measure's median over the runs that measured it, -1
// if none did.
func medianWork(ws []dbWork) dbWork {
	of := func(f func(dbWork) float64) float64 {
		xs := make([]float64, 0, len(ws))
		for _, w := range ws {
			if v := f(w); v >= 0 {
				xs = append(xs, v)
			}
		}
		if len(xs) == 0 {
			return -1
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
	var available bool
	if err := withConn(ctx, server, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_stat_statements')").Scan(&available)
	}); err != nil {
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
	var loaded bool
	err := withConn(ctx, server, func(conn *pgx.Conn) error {
		if err := conn.QueryRow(ctx, "SELECT current_setting('shared_preload_libraries') LIKE '%pg_stat_statements%'").Scan(&loaded); err != nil || !loaded {
			return err
		}
		for _, statement := range []string{
			"CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
			"ALTER SYSTEM SET pg_stat_statements.track_utility = off",
			"SELECT pg_reload_conf()",
		} {
			if _, err := conn.Exec(ctx, statement); err != nil {
				return fmt.Errorf("%s: %w", statement, err)
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("configure PostgreSQL: %w", err)
	}
	return loaded, nil
}

// workSince starts counting d's work. The function it returns ends the
// count for students students; call it after the services have stopped.
// A session's commits reach pg_stat_database at the latest as it ends
// (a busy one's at most once a second before that), so the end first
// closes the bench's own sessions in the two databases and waits for
// every session there to be gone; then each commit of the run is counted.
//
// The bench's own sessions read those databases while the count runs (to
// watch for links). With pg_stat_statements their statements are left
// out by role, and their commits, one per statement, by that count;
// without it they stay in, one per 50 ms poll.
//
// If the sessions are not gone within ten seconds the run's work is
// unmeasured, with a line saying so, rather than the bench failing.
//
// postmaster != 0 says the server is the bench's own: on another, other
// sessions' WAL and statements would count too.
func (b *bench) workSince(ctx context.Context, d *databases) (func(ctx context.Context, students int) (dbWork, error), error) {
	if b.postmaster == 0 {
		return func(context.Context, int) (dbWork, error) { return unmeasured, nil }, nil
	}
	names := []string{d.student, d.users}
	var before workCounts
	err := b.withServer(ctx, func(conn *pgx.Conn) error {
		// A checkpoint first: the first change to a page after one writes
		// the whole page to the WAL, so without it a run's WAL would depend
		// on when the last checkpoint happened to fall.
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			return err
		}
		if b.statements {
			// From nothing: the run's databases are new, and a reset keeps
			// the view's entries few (it evicts when full, losing calls).
			if _, err := conn.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
				return err
			}
		}
		var err error
		before, err = readWork(ctx, conn, names, b.statements)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("count work: %w", err)
	}
	return func(ctx context.Context, students int) (dbWork, error) {
		for _, pool := range []*pgxpool.Pool{d.studentAdmin, d.usersAdmin} {
			if pool != nil {
				pool.Reset() // the pools open new sessions when next used
			}
		}
		var after workCounts
		gone := true
		err := b.withServer(ctx, func(conn *pgx.Conn) error {
			var err error
			if gone, err = waitSessionsGone(ctx, conn, names, 10*time.Second); err != nil || !gone {
				return err
			}
			after, err = readWork(ctx, conn, names, b.statements)
			return err
		})
		if err != nil {
			return dbWork{}, fmt.Errorf("count work: %w", err)
		}
		if !gone {
			b.printf("work per student not measured: sessions still open in %v 10s after the services stopped\n", names)
			return unmeasured, nil
		}
		n := float64(students)
		w := dbWork{
			statements: -1,
			commits:    (after.commits - before.commits) / n,
			walBytes:   (after.wal - before.wal) / n,
		}
		if b.statements {
			w.statements = (after.statements - before.statements) / n
			w.commits = (after.commits - before.commits - (after.benchStatements - before.benchStatements)) / n
		}
		return w, nil
	}, nil
}

// withServer runs f on a connection of its own to the server, as the
// bench's administrator, in no database of a run's.
func (b *bench) withServer(ctx context.Context, f func(conn *pgx.Conn) error) error {
	return withConn(ctx, b.server.String(), f)
}

// withConn runs f on a connection of its own to dbURL, closed after.
func withConn(ctx context.Context, dbURL string, f func(conn *pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return f(conn)
}

// workCounts are the server's counters at one moment: the named
// databases' commits, the WAL's insert position, and with
// pg_stat_statements, the calls of statements in those databases by the
// services and by the bench's own role.
type workCounts struct {
	commits, wal                float64
	statements, benchStatements float64
}

// readWork reads the counters of the named databases.
func readWork(ctx context.Context, conn *pgx.Conn, names []string, statements bool) (workCounts, error) {
	var c workCounts
	if err := conn.QueryRow(ctx, `
		SELECT (SELECT COALESCE(sum(xact_commit), 0)::float8 FROM pg_stat_database WHERE datname = ANY($1)),
		       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8`, names).Scan(&c.commits, &c.wal); err != nil {
		return workCounts{}, err
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
		return workCounts{}, err
	}
	return c, nil
}

// waitSessionsGone waits up to patience until no session is connected to
// the named databases, and says whether none is.
func waitSessionsGone(ctx context.Context, conn *pgx.Conn, names []string, patience time.Duration) (bool, error) {
	deadline := time.Now().Add(patience)
	for {
		var open int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY($1)", names).Scan(&open); err != nil {
			return false, err
		}
		if open == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
