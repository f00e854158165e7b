package pgcluster

import (
	"context"
	"io/fs"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// startCluster fails rather than skips when the binaries are missing: a
// skipped database test looks green in CI while testing nothing.
func startCluster(t *testing.T, ctx context.Context) *Cluster {
	t.Helper()
	binDir, err := FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Start(ctx, Options{Log: t.Output(), BinDir: binDir})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Cleanup(ctx))
	})
	return c
}

func selectOne(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&n))
	require.Equal(t, 1, n)
}

func TestClusterLifecycle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c := startCluster(t, ctx)
	require.NotZero(t, c.Port())
	require.FileExists(t, c.LogPath())

	// A name that only works if it is quoted properly.
	url, err := c.CreateDatabase(ctx, `outbox "test" db`)
	require.NoError(t, err)
	selectOne(t, ctx, url)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	var setting string
	require.NoError(t, conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
	require.NoError(t, conn.Close(ctx))
	require.Equal(t, "on", setting, "commits in a created database are durable")

	port := c.Port()
	require.NoError(t, c.Restart(ctx))
	require.Equal(t, port, c.Port(), "restart must keep the port so existing URLs stay valid")
	selectOne(t, ctx, url)

	pid, err := c.postmasterPID()
	require.NoError(t, err)
	require.NoError(t, c.Cleanup(ctx))
	require.NoError(t, c.Cleanup(ctx), "second Cleanup must be harmless")
	require.False(t, alive(pid), "postmaster %d still running after Cleanup", pid)
	_, err = os.Stat(c.DataDir())
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// The end-to-end suite kills the server to simulate a crash and then brings
// it back; the data written before the crash must survive recovery.
func TestKillThenRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c := startCluster(t, ctx)
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	// The cluster runs with synchronous_commit=off, which may lose the last
	// few hundred milliseconds of commits in a crash; this session opts back
	// in so that what it committed is certain to be in the WAL.
	_, err = conn.Exec(ctx, "SET synchronous_commit = on; CREATE TABLE survivor (id int); INSERT INTO survivor VALUES (42)")
	require.NoError(t, err)

	pid, err := c.postmasterPID()
	require.NoError(t, err)
	require.NoError(t, c.Kill())
	require.False(t, alive(pid))
	// The old session must be dead, not quietly served by an orphan.
	require.Error(t, conn.Ping(ctx))
	_ = conn.Close(ctx)

	require.NoError(t, c.Restart(ctx))
	conn, err = pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var id int
	require.NoError(t, conn.QueryRow(ctx, "SELECT id FROM survivor").Scan(&id))
	require.Equal(t, 42, id)
}

func TestParseVersionOrdersNumerically(t *testing.T) {
	v96, ok := parseVersion("9.6")
	require.True(t, ok)
	v15, ok := parseVersion("15")
	require.True(t, ok)
	require.Positive(t, slices.Compare(v15, v96))
	_, ok = parseVersion("common")
	require.False(t, ok)
}

// TestHomeKeepsTheCluster: a cluster started in Home keeps its data when
// cleaned up, and a second Start there finds it.
func TestHomeKeepsTheCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	binDir, err := FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir(): the server may run as another user, who must be able
	// to reach the folder.
	home, err := os.MkdirTemp("", "pgcluster-home-") //nolint:usetesting // see above: t.TempDir() is not reachable by the server's user
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(home) })
	start := func() *Cluster {
		c, err := Start(ctx, Options{Log: t.Output(), BinDir: binDir, Home: home})
		require.NoError(t, err)
		return c
	}
	first := start()
	db, err := first.CreateDatabase(ctx, "kept")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, db)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE t AS SELECT 42 AS n")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, first.Cleanup(ctx))
	require.DirExists(t, first.DataDir(), "Cleanup leaves a kept cluster's files")

	second := start()
	t.Cleanup(func() { _ = second.Cleanup(context.Background()) })
	conn, err = pgx.Connect(ctx, second.databaseURL("kept"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT n FROM t").Scan(&n))
	require.Equal(t, 42, n, "the second run finds the first one's data")
}
