package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/freeport"
)

// TestDataDirDatabase: RUN_DATA_DIR=.run/pg in a checkout without .run
// works when make run runs as root (the server then runs as another user,
// who must reach the folder); the database checks the administrator's
// password, which the block prints in UDB, and SDB is the sender's login
// that "outbox-sender dead" needs. A start that fails leaves no folder.
func TestDataDirDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Not t.TempDir(): the server's user must pass through it, as through
	// a checkout.
	checkout, err := os.MkdirTemp("", "run-test-") //nolint:usetesting // see above
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(checkout) })
	require.NoError(t, os.Chmod(checkout, 0o755))

	// Not make run's own ports: a person's make run may hold them.
	base, err := freeport.Block(portCount)
	require.NoError(t, err)
	s := &system{cfg: config{portBase: base, dataDir: filepath.Join(checkout, ".run", "pg")}, sec: secretsForRun()}
	err = s.database(ctx, io.Discard)
	if s.cluster != nil {
		t.Cleanup(func() { _ = s.cluster.Cleanup(context.Background()) })
	}
	require.NoError(t, err)

	var block bytes.Buffer
	s.printBlock(&block)
	udb := regexp.MustCompile(`(?m)^  UDB=(\S+)$`).FindStringSubmatch(block.String())
	require.NotNil(t, udb, "the block prints UDB:\n%s", block.String())
	conn, err := pgx.Connect(ctx, udb[1])
	require.NoError(t, err, "UDB logs in as printed")
	require.NoError(t, conn.Close(ctx))
	require.Contains(t, block.String(), "password "+s.cluster.Password()+" (kept in "+s.cluster.PasswordFile()+")")

	noPassword, err := url.Parse(udb[1])
	require.NoError(t, err)
	noPassword.User = url.User("postgres")
	cc, err := pgx.ParseConfig(noPassword.String())
	require.NoError(t, err)
	cc.Password = "" // not one from PGPASSWORD or a .pgpass
	_, err = pgx.ConnectConfig(ctx, cc)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "a login without the password is refused")
	require.Equal(t, "28P01", pgErr.Code)

	require.Contains(t, block.String(), "\n  SDB=postgres://outbox_sender:"+s.sec.sender+"@127.0.0.1:"+
		strconv.Itoa(s.cfg.port(portPostgres))+"/student?sslmode=disable\n")
	require.Contains(t, block.String(), "SENDER_DATABASE_URL=$SDB "+filepath.Join(s.work, "bin", "outbox-sender")+" dead list")

	// A port someone else holds fails the start, after initdb.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	failing := &system{cfg: config{portBase: ln.Addr().(*net.TCPAddr).Port - portPostgres, dataDir: filepath.Join(checkout, ".new", "pg")}}
	require.Error(t, failing.database(ctx, io.Discard))
	require.NoDirExists(t, filepath.Join(checkout, ".new"), "a failed start leaves nothing behind")
}
