package deadletter

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// FuzzDeadCommandArgs runs "outbox-sender dead" with arbitrary arguments
// (the input's lines) on a real database. Whatever they are: no panic, an
// answer within the database timeout, nothing a terminal would act on in
// what it prints or in its error (the arguments are echoed in errors), and
// the outbox changed only by a redrive that succeeded.
func FuzzDeadCommandArgs(f *testing.F) {
	for _, seed := range []string{
		"list", "list\n--state\npending", "list\n--reason-class\nrefused\n--limit\n5", "list\n--limit\n05", "list\n--since\nyesterday",
		"show\n1", "show\n007", "show\n+1", "show\n1\nmore",
		"redrive\n1\n--mode\nretry", "redrive\n2\n--mode\nnew-operation", "redrive\n3\n--mode=new-operation\n--force",
		"redrive\n1\n--mode\nretry\n--mode\nnew-operation", "redrive\n1", "redrive\n--mode\nretry",
		"redrive-all\n--mode\nretry\n--dry-run", "redrive-all\n--mode\nretry\n--reason-class\nrefused\n--reason-class\nexpired",
		"redrive-all\n--mode\nretry\n--max\n0", "redrive-all\n--mode\nnew-operation\n--since\n2026-01-01T00:00:00Z",
		"--help", "redrive\n-h", "", "\x1b[31m", "list\n--\x1b[2J", "show\n\u202e1", "bogus\n--x",
	} {
		f.Add(seed)
	}
	pool := pgtest.Pool(f, migrations.Student)
	pgtest.AddStudents(f, pool, 5)
	_, err := pool.Exec(context.Background(), `UPDATE outbox SET state = 'dead', dead_at = now(), attempts = 1,
		reason_class = (ARRAY['refused','expired','users-unavailable'])[1 + id % 3], last_error = e'Users said \x1b[31mno\x1b[0m\r\nforged'`)
	require.NoError(f, err)
	sender := pgtest.As(f, pool, migrations.OutboxSender)
	dead := Command(3*time.Second, DefaultMaxRedrives, DefaultKeyWindow)
	read := func(t *testing.T) string {
		t.Helper()
		var s string
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT string_agg(concat_ws('|', id, state, idempotency_key, redrives), ',' ORDER BY id) FROM outbox`).Scan(&s))
		return s
	}
	f.Fuzz(func(t *testing.T, input string) {
		args := strings.Split(input, "\n")
		if input == "" {
			args = nil
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		before := read(t)
		var out bytes.Buffer
		err := dead(ctx, sender, args, &out)
		require.NoError(t, ctx.Err(), "answered within its timeout")
		requireInert(t, out.String(), "output")
		if err != nil {
			requireInert(t, err.Error(), "error")
		}
		redrove := err == nil && len(args) > 0 && (args[0] == "redrive" || args[0] == "redrive-all")
		if !redrove {
			require.Equal(t, before, read(t), "%q changed the outbox (error: %v)", args, err)
		}
	})
}

// requireInert fails if s holds a character a terminal would act on
// rather than show: controls other than a line break or tab, and format
// characters such as bidi overrides.
func requireInert(t *testing.T, s, what string) {
	t.Helper()
	for _, r := range s {
		if r == '\n' || r == '\t' {
			continue
		}
		require.False(t, unicode.IsControl(r) || unicode.Is(unicode.Cf, r), "%s holds %U: %q", what, r, s)
	}
}
