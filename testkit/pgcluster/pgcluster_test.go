package pgcluster

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// startCluster fails rather than skips when the binaries are missing: a
// skipped database test looks green in CI while testing nothing.
func startCluster(t *testing.T, ctx context.Context) *Cluster {
	t.Helper()
	c, err := Start(ctx, Options{Log: t.Output(), BinDir: binDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Cleanup(ctx))
	})
	return c
}

func binDir(t *testing.T) string {
	t.Helper()
	dir, err := FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// reachableDir is a folder for a Home, removed at cleanup. Not t.TempDir():
// the server may run as another user, who must be able to pass through it.
func reachableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgcluster-test-") //nolint:usetesting // see above: t.TempDir() is not reachable by the server's user
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
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
	binDir := binDir(t)
	home := reachableDir(t)
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
	require.NoError(t, conn.Close(ctx))

	// A cluster kept from before the administrator had a password is
	// refused, not started as the trusting cluster it is, and kept.
	require.NoError(t, second.Cleanup(ctx))
	require.NoError(t, os.Remove(second.PasswordFile()))
	_, err = Start(ctx, Options{Log: t.Output(), BinDir: binDir, Home: home})
	require.ErrorContains(t, err, "remove the directory to start afresh")
	require.FileExists(t, filepath.Join(second.DataDir(), "PG_VERSION"))
}

// TestEveryRoleNeedsItsPassword: no role logs in without its password, the
// administrator included, over TCP or over the Unix socket; the password
// is kept where only its owner reads it, and the socket's directory is the
// server's user's alone.
func TestEveryRoleNeedsItsPassword(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startCluster(t, ctx)

	require.Len(t, c.Password(), 32)
	fi, err := os.Stat(c.PasswordFile())
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm(), "the password file is its owner's alone")
	b, err := os.ReadFile(c.PasswordFile())
	require.NoError(t, err)
	require.Equal(t, c.Password(), strings.TrimSpace(string(b)))
	require.Contains(t, c.URL(), ":"+c.Password()+"@", "the administrator's URL carries the password")

	fi, err = os.Stat(c.dir)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "the socket's directory is private")
	owner := uint32(os.Geteuid())
	if c.cred != nil {
		owner = c.cred.Uid
	}
	require.Equal(t, owner, fi.Sys().(*syscall.Stat_t).Uid, "the socket's directory belongs to the server's user")

	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE ROLE app LOGIN PASSWORD 'app-pw'")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	login := func(host, role, password string) error {
		cc, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=%s dbname=postgres sslmode=disable", host, c.Port(), role))
		require.NoError(t, err)
		cc.Password = password // not one from PGPASSWORD or a .pgpass
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}
	for _, host := range []string{"127.0.0.1", c.dir} {
		for role, password := range map[string]string{"postgres": c.Password(), "app": "app-pw"} {
			for _, wrong := range []string{"", "not-" + password} {
				err := login(host, role, wrong)
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, "%s at %s with password %q: want a refusal", role, host, wrong)
				require.Equal(t, "28P01", pgErr.Code, "%s at %s with password %q", role, host, wrong)
			}
			require.NoError(t, login(host, role, password), "%s at %s with its password", role, host)
		}
	}
}

// TestHomeWithMissingParents: a Home whose parents do not exist yet, as
// RUN_DATA_DIR=.run/pg in a fresh checkout, works when we are root and the
// server runs as another user; and a Start that fails removes what it made,
// parents included, or what it wrote in a Home that was there already.
func TestHomeWithMissingParents(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	binDir := binDir(t)
	base := reachableDir(t) // a checkout, say

	home := filepath.Join(base, ".run", "pg")
	c, err := Start(ctx, Options{Log: t.Output(), BinDir: binDir, Home: home})
	require.NoError(t, err)
	selectOne(t, ctx, c.URL())
	require.NoError(t, c.Cleanup(ctx))
	fi, err := os.Stat(filepath.Join(base, ".run"))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o755), fi.Mode().Perm(), "the server's user must pass through the parent")

	// A port someone else holds makes the start fail after initdb.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port

	_, err = Start(ctx, Options{Log: t.Output(), BinDir: binDir, Home: filepath.Join(base, "new", "pg"), Port: taken})
	require.Error(t, err)
	require.NoDirExists(t, filepath.Join(base, "new"), "a failed start removes the directories it made")

	empty := filepath.Join(base, "empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	_, err = Start(ctx, Options{Log: t.Output(), BinDir: binDir, Home: empty, Port: taken})
	require.Error(t, err)
	entries, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, entries, "a failed start removes the cluster it made in a Home that was there")

	// A kept cluster is not removed because one start failed.
	_, err = Start(ctx, Options{Log: t.Output(), BinDir: binDir, Home: home, Port: taken})
	require.Error(t, err)
	require.FileExists(t, filepath.Join(home, "data", "PG_VERSION"))
	require.FileExists(t, filepath.Join(home, passwordFile))
}
