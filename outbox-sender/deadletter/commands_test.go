package deadletter

import (
	"bytes"
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestDeadCommandArguments: the "dead" command refuses what it would
// otherwise guess at (a flag given twice, an id that is not written as the
// API writes it), prints its usage when asked, and never prints an
// upstream error's control characters raw to the operator's terminal.
func TestDeadCommandArguments(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 1)
	hostile := "Users said \x1b[31mred\x1b[0m\r\nforged line \u009b2J and \u202egnp.exe"
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'refused', last_error = $1 RETURNING id", hostile).Scan(&id))
	dead := Command(3*time.Second, DefaultMaxRedrives, DefaultKeyWindow)
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := dead(context.Background(), pgtest.As(t, pool, migrations.OutboxSender), args, &out)
		return out.String(), err
	}
	raw := func(s string) bool { return strings.ContainsAny(s, "\x1b\r\u009b\u202e") }

	out, err := run("list")
	require.NoError(t, err)
	require.False(t, raw(out), "list prints no control character raw: %q", out)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2, "a header and one line: %q", out)
	require.Contains(t, out, `\x1b[31mred`)
	out, err = run("show", strconv.FormatInt(id, 10))
	require.NoError(t, err)
	require.False(t, raw(out), "show prints no control character raw: %q", out)

	for _, bad := range []string{"0" + strconv.FormatInt(id, 10), "+" + strconv.FormatInt(id, 10), "0", "-1", " 1"} {
		_, err := run("redrive", bad, "--mode", "retry")
		require.ErrorContains(t, err, "without sign or leading zeros", bad)
		_, err = run("show", bad)
		require.ErrorContains(t, err, "without sign or leading zeros", bad)
	}
	for _, args := range [][]string{
		{"redrive-all", "--mode", "retry", "--reason-class", "refused", "--reason-class", "expired"},
		{"redrive-all", "--mode", "new-operation", "--mode", "retry"},
		{"redrive", strconv.FormatInt(id, 10), "--mode", "retry", "--mode", "new-operation"},
		{"redrive", strconv.FormatInt(id, 10), "--mode", "retry", "--force", "--force"},
		{"list", "--limit", "5", "--limit", "6"},
	} {
		_, err := run(args...)
		require.ErrorContains(t, err, "given twice", args)
	}
	for _, bad := range []string{"05", "+5", ""} {
		_, err := run("list", "--limit", bad)
		require.ErrorContains(t, err, "--limit", bad)
	}
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND redrives = 0"), "nothing was redriven")

	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"redrive", "--help"}, {"redrive-all", "-h"}, {"list", "--help"}} {
		out, err := run(args...)
		require.NoError(t, err, args)
		require.Contains(t, out, "usage:\n  outbox-sender dead list", args)
	}
}

// TestDeadCommandSaysWhereItDialled: when the command cannot log in, it says
// which server, database and login it tried, the password masked: a URL
// left at its default reaches whatever listens on localhost:5432, whose
// answer alone would send the operator after the role.
func TestDeadCommandSaysWhereItDialled(t *testing.T) {
	t.Parallel()
	dbURL, err := url.Parse(pgtest.ServerURL(t))
	require.NoError(t, err)
	dead := Command(3*time.Second, DefaultMaxRedrives, DefaultKeyWindow)
	where := dbURL.Host + dbURL.Path

	// A role no server has: refused whether the server checks passwords or not.
	dbURL.User = url.UserPassword("no_such_role_here", "s3cret-password")
	err = dead(context.Background(), pgtest.Connect(t, dbURL.String()), []string{"list"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "dialled postgres://no_such_role_here:xxxxx@"+where+", with a password")
	require.ErrorContains(t, err, "SENDER_DATABASE_URL")
	require.NotContains(t, err.Error(), "s3cret-password")

	dbURL.User = url.User("no_such_role_here")
	err = dead(context.Background(), pgtest.Connect(t, dbURL.String()), []string{"show", "1"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "dialled postgres://no_such_role_here@"+where+", with no password")
}
