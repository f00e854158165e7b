package main

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestWorkSince counts real work: the commits of a service's role in the
// run's databases, per student, and the WAL they wrote, read once the
// role's sessions have ended.
func TestWorkSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
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
	// are read by database, so the shared test server does here.
	b := &bench{server: server, postmaster: 1}
	done, err := b.workSince(ctx, d)
	require.NoError(t, err)

	const n = 20
	app := pgtest.ConnectAs(t, studentURL, migrations.StudentApp)
	pgtest.AddStudents(t, app, n) // a commit each
	app.Close()
	w, err := done(ctx, n)
	require.NoError(t, err)
	// The databases' setting-up sessions may report a few late commits.
	require.InDelta(t, 1.0, w.commits, 0.25)
	require.Positive(t, w.walBytes)
	require.Negative(t, w.statements, "not counted without pg_stat_statements")

	// Not the bench's own server: nothing is counted.
	b.postmaster = 0
	done, err = b.workSince(ctx, d)
	require.NoError(t, err)
	w, err = done(ctx, n)
	require.NoError(t, err)
	require.Equal(t, unmeasured, w)
}

func TestMedianWork(t *testing.T) {
	t.Parallel()
	got := medianWork([]dbWork{
		{statements: 6, commits: 1.2, walBytes: 4096},
		{statements: 7, commits: 1.0, walBytes: 2048},
		{statements: 5, commits: -1, walBytes: 3072},
	})
	require.Equal(t, dbWork{statements: 6, commits: -1, walBytes: 3072}, got)
	require.Equal(t, "statements 6.00, commits -, WAL 3.0 kB", got.String())
	require.Equal(t, "statements -, commits -, WAL -", medianWork(nil).String())
}
