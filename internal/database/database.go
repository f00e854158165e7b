// Package database is how the binaries connect to PostgreSQL: one function
// builds every pool, so that no connection a binary opens can wait without a
// bound, and one classifier tells "the database is unavailable or did not
// answer in time" from every other database error.
//
// A connection can stop answering without closing: a NAT or firewall that
// forgets the connection, a proxy that freezes, a host that vanished. Neither
// end notices by itself. A transaction left open on such a connection keeps
// its locks for as long as the server keeps the session, which without limits
// is hours. So each end bounds it:
//
//   - the server ends a session left idle in a transaction
//     (idle_in_transaction_session_timeout) and any statement that runs too
//     long (statement_timeout), and probes a silent client with TCP
//     keepalives and TCP_USER_TIMEOUT (tcp_keepalives_*, tcp_user_timeout);
//   - the client (pgx) probes a silent server the same way, bounds
//     connecting, and each caller puts a deadline on each transaction.
package database

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The limits every connection gets, whatever the binary. A frozen
// connection is cleared by one of them well within a minute.
const (
	// IdleInTransactionTimeout ends a session that sits inside a transaction
	// without sending anything. The binaries' transactions never pause
	// between statements for more than a moment, so reaching it means the
	// client is gone or frozen; ending the session releases its locks.
	IdleInTransactionTimeout = 10 * time.Second
	// ConnectTimeout bounds connecting, TLS and authentication included.
	ConnectTimeout = 5 * time.Second
	// KeepAliveIdle, KeepAliveInterval and KeepAliveCount make each end
	// probe an idle peer: a peer that answers none of the probes is declared
	// dead after about 5s + 3 × 5s = 20s.
	KeepAliveIdle     = 5 * time.Second
	KeepAliveInterval = 5 * time.Second
	KeepAliveCount    = 3
	// UserTimeout (TCP_USER_TIMEOUT) drops a connection whose sent data
	// stays unacknowledged this long. Keepalives cover a silent idle
	// connection; this covers one that stopped acknowledging what was sent.
	UserTimeout = 15 * time.Second
)

// Limits are what may differ between one binary's pools and another's.
type Limits struct {
	// MaxConns is the pool's size; 0 for pgx's default.
	MaxConns int32
	// StatementTimeout is the server's statement_timeout: no statement,
	// lock waits included, runs longer. 0 leaves statements unbounded, which
	// only migrations should do (an index build may take minutes).
	StatementTimeout time.Duration
	// IdleInTransaction overrides IdleInTransactionTimeout when positive
	// (tests use a short one).
	IdleInTransaction time.Duration
}

// Config parses dbURL and applies the limits: server-side settings sent with
// every connection's start-up packet, and a dialer with keepalives and
// TCP_USER_TIMEOUT. The binary's own limits replace any the URL sets, so
// that a URL copied from elsewhere cannot lift them. The error never echoes
// the URL, which may hold a password.
func Config(dbURL string, l Limits) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, errors.New("parse database URL: malformed")
	}
	if l.MaxConns > 0 {
		cfg.MaxConns = l.MaxConns
	}
	idle := IdleInTransactionTimeout
	if l.IdleInTransaction > 0 {
		idle = l.IdleInTransaction
	}
	cc := cfg.ConnConfig
	if cc.ConnectTimeout <= 0 || cc.ConnectTimeout > ConnectTimeout {
		cc.ConnectTimeout = ConnectTimeout
	}
	// Settings in the start-up packet take effect before the first query,
	// with no extra round trip. The server ignores the tcp_* ones on a Unix
	// socket, where there is no TCP to probe. (A pooler between the binary
	// and PostgreSQL, such as PgBouncer, must be told to pass them on or
	// ignore them: ignore_startup_parameters.)
	params := map[string]time.Duration{
		"statement_timeout": l.StatementTimeout,
		// A statement that waits for a lock gives up at half its time, with
		// an error that says so (55P03) rather than a bare timeout; the
		// inbox sets its own, shorter, per transaction.
		"lock_timeout":                        l.StatementTimeout / 2,
		"idle_in_transaction_session_timeout": idle,
		"tcp_keepalives_idle":                 KeepAliveIdle,
		"tcp_keepalives_interval":             KeepAliveInterval,
		"tcp_user_timeout":                    UserTimeout,
	}
	for name, d := range params {
		cc.RuntimeParams[name] = strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
	cc.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(KeepAliveCount)

	dialer := &net.Dialer{
		Timeout: cc.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount,
		},
		Control: setUserTimeout(UserTimeout),
	}
	cc.DialFunc = dialer.DialContext
	return cfg, nil
}

// Open returns a pool on dbURL with the limits applied (see Config). It
// does not connect yet: the first use does, so a binary starts even while
// its database is down, and answers 503 until it is back.
func Open(ctx context.Context, dbURL string, l Limits) (*pgxpool.Pool, error) {
	cfg, err := Config(dbURL, l)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	return pool, nil
}

// Where says which server and database dbURL names, as host:port/database,
// for a log line: never the user or the password. It is "(unparsable)"
// for a URL Config would refuse.
func Where(dbURL string) string {
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		return "(unparsable)"
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))) + "/" + cfg.Database
}

// DefaultTimeout is the deadline of a transaction whose caller configured
// none (a zero Config in a test or a library use): no transaction goes
// unbounded. The binaries always configure their own.
const DefaultTimeout = 10 * time.Second

// DeleteInBatches runs a delete of at most batch rows, each run within its
// own deadline of timeout, until one deletes fewer than batch rows, and
// returns how many rows went. Retention purges use it: short statements,
// so that a purge never holds locks or a snapshot for long. what names the
// work in the error.
func DeleteInBatches(ctx context.Context, timeout time.Duration, batch int32, what string, del func(context.Context) (int64, error)) (int64, error) {
	var total int64
	for {
		bctx, cancel := WithDeadline(ctx, timeout)
		n, err := del(bctx)
		cancel()
		total += n
		if err != nil {
			return total, fmt.Errorf("%s: %w", what, Classify(err))
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// WithDeadline bounds ctx by d, or by DefaultTimeout when d is not
// positive. Every transaction and read of the binaries runs under one.
func WithDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		d = DefaultTimeout
	}
	return context.WithTimeout(ctx, d)
}

// ErrUnavailable marks an error that means the database is unavailable or
// did not answer in time: nothing is wrong with the request, and a retry
// later may succeed. Classify adds it.
var ErrUnavailable = errors.New("database unavailable")

// Classify returns err wrapped with ErrUnavailable when it means the
// database is unavailable or did not answer in time, and err unchanged
// otherwise (nil stays nil).
func Classify(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// unavailableCodes are the SQLSTATEs, besides class 08 (connection
// exception), that say the server could not serve the request now.
var unavailableCodes = []string{
	"57P01", // admin_shutdown: the server is shutting down
	"57P02", // crash_shutdown: another backend crashed, the server restarts
	"57P03", // cannot_connect_now: starting up or in recovery
	"53300", // too_many_connections
	"57014", // query_canceled: statement_timeout fired (or an operator cancelled)
	"25P03", // idle_in_transaction_session_timeout: the session was ended under us
}

func unavailable(err error) bool {
	var (
		connectErr *pgconn.ConnectError
		pgErr      *pgconn.PgError
		netErr     net.Error
	)
	switch {
	case errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000"):
		// A wrong password or role, or a database that does not exist: a
		// misconfiguration, which waiting and retrying will not cure.
		return false
	case errors.As(err, &connectErr):
		// Any other failure to connect (refused, timed out, the server
		// starting up, too many connections).
		return true
	case errors.As(err, &pgErr):
		// The server answered: only these codes mean it could not serve.
		return strings.HasPrefix(pgErr.Code, "08") || slices.Contains(unavailableCodes, pgErr.Code)
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err) && !errors.Is(err, context.Canceled):
		// A transaction's deadline passed. context.Canceled is not here:
		// that is the caller giving up, not the database failing.
		return true
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, pgconn.ErrConnClosed):
		// The connection broke while in use.
		return true
	}
	return false
}
