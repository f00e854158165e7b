package reconcile

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
)

// TestOnceText: without --json, once writes a report for a person: the
// verdict first, what it read, a line per class, then what each class
// found means; ids only.
func TestOnceText(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	b := w.linked()
	lost := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
	stuck := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
	w.addOutbox(stuck, outbox.StatePending, outbox.ReasonUsersUnavailable, ago(time.Hour))

	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Run(ctx, []string{"once"}, w.env(), &out)
	require.ErrorIs(t, err, ErrDrift)
	require.Equal(t, 1, ExitCode(err))
	text := out.String()
	t.Log("\n" + text)
	first, _, _ := strings.Cut(text, "\n")
	require.Contains(t, first, "full pass")
	require.Contains(t, first, "DRIFT: lost 1")
	require.Contains(t, text, "judged students: 3, users: 1;")
	require.Regexp(t, `(?m)^lost\s+1\s+1h0m\d+s\s+`+lost.String()+`$`, text)
	require.Regexp(t, `(?m)^stuck\s+1\s+`, text)
	require.Regexp(t, `(?m)^missing-user\s+0\s+-\s*$`, text)
	require.Contains(t, text, "1 pending/users-unavailable")
	require.Contains(t, text, "lost: A student that will never get its user")
	require.NotContains(t, text, b.doc, "no document number")
	require.NotContains(t, text, "A Student", "no name")
}

// TestOnceExitStatus: 0 without drift (stuck and dead rows are not drift),
// 1 with it, 2 when the reconciler could not check: a database it cannot
// reach, or arguments it does not know.
func TestOnceExitStatus(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.linked()
	_, code := w.once()
	require.Equal(t, 0, code)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nowhere := "postgres://reconciler:secret-password@" + apitest.FreeAddr(t) + "/student?sslmode=disable&connect_timeout=2"
	var out bytes.Buffer
	err := Run(ctx, []string{"once"}, w.env("RECONCILER_STUDENT_DATABASE_URL", nowhere), &out)
	require.Equal(t, 2, ExitCode(err), "%v", err)
	require.ErrorContains(t, err, "could not check")
	require.ErrorContains(t, err, "Student's database")
	require.NotContains(t, err.Error(), "secret-password")
	require.Empty(t, out.String(), "no report when nothing was checked")

	for _, args := range [][]string{nil, {"twice"}, {"once", "--yaml"}, {"serve", "--json"}} {
		err := Run(ctx, args, w.env(), &out)
		require.Equal(t, 2, ExitCode(err), "%q", args)
		require.ErrorContains(t, err, "want once [--json], serve or healthcheck")
	}
}

// TestBadConfiguration: every bad variable is named at once, and no
// password is shown.
func TestBadConfiguration(t *testing.T) {
	t.Parallel()
	_, _, err := LoadConfig(apitest.Env(
		"RECONCILER_STUDENT_DATABASE_URL", "postgres://reconciler:hunter2@db/student",
		"RECONCILER_STUDENT_DATABASE_PASSWORD", "also-secret",
		"RECONCILER_USERS_DATABASE_URL", "mysql://db/users",
		"RECONCILER_PAGE_SIZE", "0",
		"RECONCILER_STUCK_AFTER", "soon",
		"RECONCILER_INTERVAL", "2h",
		"RECONCILER_SENDER_CALLER", "Outbox Sender",
		"RECONCILER_ADMIN_TOKENS", "ops:short",
	))
	require.Error(t, err)
	for _, v := range []string{
		"RECONCILER_STUDENT_DATABASE_URL has a password and RECONCILER_STUDENT_DATABASE_PASSWORD", "RECONCILER_USERS_DATABASE_URL",
		"RECONCILER_PAGE_SIZE", "RECONCILER_STUCK_AFTER", "RECONCILER_INTERVAL=2h0m0s must not exceed RECONCILER_FULL_EVERY=1h0m0s",
		"RECONCILER_SENDER_CALLER", "RECONCILER_ADMIN_TOKENS",
	} {
		require.ErrorContains(t, err, v)
	}
	for _, secret := range []string{"hunter2", "also-secret", "short"} {
		require.NotContains(t, err.Error(), secret)
	}
	require.Equal(t, 2, ExitCode(err))

	cfg, _, err := LoadConfig(apitest.Env())
	require.NoError(t, err, "the defaults are a valid configuration")
	require.Equal(t, 15*time.Minute, cfg.StuckAfter)
	require.Equal(t, "127.0.0.1:8092", cfg.AdminAddr)
}
