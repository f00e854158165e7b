package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

var errDone = errors.New("done")

// TestBinaryBoundsItsDatabase: the pool a binary serves with runs under the
// server-side limits, with the binary's DatabaseTimeout as the statement
// timeout, and the binary's pool size.
func TestBinaryBoundsItsDatabase(t *testing.T) {
	t.Parallel()
	settings := map[string]string{}
	var maxConns, adminMaxConns int32
	var samePool bool
	err := Binary{
		Name: "test", DatabaseURL: pgtest.EmptyURL(t), MaxConns: 3, AdminMaxConns: 2, DatabaseTimeout: 1500 * time.Millisecond, LogLevel: "error",
		Start: func(_ *slog.Logger, pools Pools) []Part {
			pool := pools.Main
			return []Part{{Name: "inspect", Run: func(ctx context.Context) error {
				maxConns = pool.Config().MaxConns
				adminMaxConns = pools.Admin.Config().MaxConns
				samePool = pools.Admin == pools.Main
				for _, name := range []string{"statement_timeout", "idle_in_transaction_session_timeout", "tcp_user_timeout"} {
					var v string
					if err := pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
						return err
					}
					settings[name] = v
				}
				return errDone // a part that returns stops the binary
			}}}
		},
	}.Run(context.Background(), nil, &bytes.Buffer{})
	require.ErrorIs(t, err, errDone)
	require.EqualValues(t, 3, maxConns)
	require.EqualValues(t, 2, adminMaxConns, "the admin listener's pool has its own size")
	require.False(t, samePool, "admin work must not draw on the binary's own pool")
	require.Equal(t, map[string]string{
		"statement_timeout":                   "1500ms",
		"idle_in_transaction_session_timeout": "10s",
		"tcp_user_timeout":                    "15000",
	}, settings)
}

// TestSetProcs: without GOMAXPROCS the process runs Go code on
// DefaultProcs cores; with it, SetProcs leaves what the runtime read from
// it, and a bad value changes nothing (CheckProcs refuses it). Not
// parallel: GOMAXPROCS is the whole test process's, and is put back
// afterwards.
func TestSetProcs(t *testing.T) { //nolint:paralleltest // changes the process's GOMAXPROCS
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	env := func(v string) func(string) string {
		return func(name string) string {
			require.Equal(t, "GOMAXPROCS", name)
			return v
		}
	}

	runtime.GOMAXPROCS(3)
	SetProcs(env("3"))
	require.Equal(t, 3, runtime.GOMAXPROCS(0), "GOMAXPROCS set: left as the runtime applied it")
	SetProcs(env("0"))
	require.Equal(t, 3, runtime.GOMAXPROCS(0), "a bad value changes nothing")

	SetProcs(env(""))
	require.Equal(t, DefaultProcs, runtime.GOMAXPROCS(0))
}

// TestCheckProcs: a GOMAXPROCS the runtime would ignore is a configuration
// error, in the one message that names every bad variable.
func TestCheckProcs(t *testing.T) {
	t.Parallel()
	for _, good := range []string{"", "1", "16"} {
		e := envconfig.New(func(string) string { return good })
		CheckProcs(e, func(string) string { return good })
		require.NoError(t, e.Err(), "GOMAXPROCS=%q", good)
	}
	for _, bad := range []string{"0", "-1", "two", "1.5"} {
		getenv := func(name string) string {
			return map[string]string{"GOMAXPROCS": bad, "LOG_LEVEL": "loud"}[name]
		}
		e := envconfig.New(getenv)
		e.OneOf("LOG_LEVEL", "info", "info", "debug")
		CheckProcs(e, getenv)
		err := e.Err()
		require.ErrorContains(t, err, `LOG_LEVEL="loud"`)
		require.ErrorContains(t, err, `GOMAXPROCS="`+bad+`": want a whole number of cores, 1 or more`)
		require.NotContains(t, e.Names(), "GOMAXPROCS", "Go's variable, not one of the binary's")
	}
}

// TestLogWritesDurationsAsText: a duration in a log line reads as Go
// writes one, at any depth of the line, never as a count of nanoseconds
// (Users' "late_by" once read 1500000000).
func TestLogWritesDurationsAsText(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	log, err := NewLogger(&b, "info")
	require.NoError(t, err)
	log.With(slog.Duration("retention", 72*time.Hour)).Info("x",
		slog.Duration("late_by", 1500*time.Millisecond), slog.Group("g", slog.Duration("delay", 2*time.Second)), slog.Int("n", 3))
	var line map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &line), b.String())
	require.Equal(t, "1.5s", line["late_by"])
	require.Equal(t, "72h0m0s", line["retention"])
	require.Equal(t, map[string]any{"delay": "2s"}, line["g"])
	require.InDelta(t, 3, line["n"], 0, "other values keep their kind")
}
