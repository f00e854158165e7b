package main

import (
	"context"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgcluster"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestWorkSince counts real work on the shared test server, where
// pg_stat_statements is not loaded: the commits of a service's role in
// the run's databases, per student, read once its sessions have ended.
func TestWorkSince(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	studentURL, usersURL := pgtest.URL(t, migrations.Student), pgtest.URL(t, migrations.Users)
	server, err := url.Parse(pgtest.ServerURL(t))
	require.NoError(t, err)
	name := func(dbURL string) string {
		u, err := url.Parse(dbURL)
		require.NoError(t, err)
		return strings.TrimPrefix(u.Path, "/")
	}
	d := &databases{student: name(studentURL), users: name(usersURL)}
	// postmaster says only that the server is the bench's own; the counts
	// are read by database, so the shared test server does here, but for
	// the WAL, which other tests write too.
	b := &bench{out: io.Discard, server: server, postmaster: 1}
	// The sessions that set the databases up may still be ending, and
	// their commits would count.
	require.NoError(t, b.withServer(ctx, func(conn *pgx.Conn) error {
		gone, err := waitSessionsGone(ctx, conn, []string{d.student, d.users}, 10*time.Second)
		require.True(t, gone)
		return err
	}))
	done, err := b.workSince(ctx, d)
	require.NoError(t, err)

	const n = 20
	app := pgtest.ConnectAs(t, studentURL, migrations.StudentApp)
	pgtest.AddStudents(t, app, n) // a commit each, and one to prepare
	app.Close()
	w, err := done(ctx, n)
	require.NoError(t, err)
	require.GreaterOrEqual(t, w.commits*n, float64(n))
	require.LessOrEqual(t, w.commits*n, float64(n+4))
	require.Negative(t, w.statements, "not counted without pg_stat_statements")

	// Not the bench's own server: nothing is counted.
	b.postmaster = 0
	done, err = b.workSince(ctx, d)
	require.NoError(t, err)
	w, err = done(ctx, n)
	require.NoError(t, err)
	require.Equal(t, unmeasured, w)
}

// TestWorkCountsStatements counts on a cluster set up as the bench sets
// up its own, with pg_stat_statements loaded: a service's statements and
// commits per student, with the bench's own reads, made while the count
// runs, left out of both, and the WAL the students wrote.
func TestWorkCountsStatements(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err, "this test starts a PostgreSQL cluster of its own (it loads a library at start)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Cleanup(ctx))
	})
	track, err := trackStatements(ctx, c.URL())
	require.NoError(t, err)
	require.NotEmpty(t, track, "pg_stat_statements ships with PostgreSQL's server package (Debian: postgresql-15): install it")
	require.NoError(t, setAndRestart(ctx, c, track))
	on, err := enableStatements(ctx, c.URL())
	require.NoError(t, err)
	require.True(t, on)

	urls := map[migrations.Set]string{}
	for _, set := range []migrations.Set{migrations.Student, migrations.Users} {
		dbURL, err := c.CreateDatabase(ctx, string(set))
		require.NoError(t, err)
		cfg, err := pgx.ParseConfig(dbURL)
		require.NoError(t, err)
		require.NoError(t, migrations.Migrate(ctx, cfg, set, pgtest.Passwords))
		urls[set] = dbURL
	}
	server, err := url.Parse(c.URL())
	require.NoError(t, err)
	d := &databases{student: string(migrations.Student), users: string(migrations.Users),
		studentAdmin: pgtest.Connect(t, urls[migrations.Student]), usersAdmin: pgtest.Connect(t, urls[migrations.Users])}
	b := &bench{out: io.Discard, server: server, postmaster: 1, statements: true}
	done, err := b.workSince(ctx, d)
	require.NoError(t, err)

	const n = 20
	app := pgtest.ConnectAs(t, urls[migrations.Student], migrations.StudentApp)
	pgtest.AddStudents(t, app, n)
	for range 20 { // the bench watching for links meanwhile
		apitest.Count(t, d.studentAdmin, "SELECT count(*) FROM students")
	}
	app.Close()
	w, err := done(ctx, n)
	require.NoError(t, err)
	require.InDelta(t, 1.0, w.statements, 1e-9, "one insert per student; the bench's reads are not the services'")
	// A commit per insert. Preparing a statement commits too, once per
	// session, and the sessions opened before the count report theirs as
	// they end: a few more, where the bench's 20 reads, if not left out,
	// would be 20 more.
	require.GreaterOrEqual(t, w.commits*n, float64(n))
	require.LessOrEqual(t, w.commits*n, float64(n+6))
	// A student and its outbox row, with their index entries, and after
	// the count's checkpoint the first change to each page in full.
	require.Greater(t, w.walBytes, 500.0)
	require.Less(t, w.walBytes, 32*1024.0)
	// The pools still work: the count closed their sessions, not them.
	require.Equal(t, n, apitest.Count(t, d.studentAdmin, "SELECT count(*) FROM students"))
}

// TestMedianWork: each measure's median is over the runs that measured
// it, and a measure no run did shows as "-".
func TestMedianWork(t *testing.T) {
	t.Parallel()
	got := medianWork([]dbWork{
		{statements: 6, commits: 1.2, walBytes: 4096},
		{statements: 7, commits: 1.0, walBytes: 2048},
		{statements: 5, commits: -1, walBytes: 3072},
	})
	require.Equal(t, "statements 6.00, commits 1.10, WAL 3.0 kB", got.String())
	require.Equal(t, "statements -, commits -, WAL -", medianWork([]dbWork{unmeasured}).String())
	require.Equal(t, unmeasured, medianWork(nil))
}
