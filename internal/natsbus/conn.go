package natsbus

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outboxref/outboxref/internal/alarm"
)

// Conn is a connection to the broker, and what the broker last said of
// its login. A refused login is kept apart from a broker that is down:
// to the client both are a connection that keeps failing, but one passes
// by itself and the other waits for a person (a wrong password, a user
// the broker does not have).
type Conn struct {
	*nats.Conn
	user string
	log  *slog.Logger

	mu      sync.Mutex
	refused error // the last refusal, nil once a login was accepted since

	refusedAlarm, asyncAlarm alarm.Alarm
	onRefused                func()
}

// ErrLoginRefused is what LoginRefused wraps: the broker refuses this
// process's NATS user or password.
var ErrLoginRefused = errors.New("the broker refuses this process's NATS login")

// Connect connects to the broker and keeps reconnecting for ever: while the
// broker is unreachable a publish or a fetch fails, and the caller's rows
// or messages wait where they are (the outbox, the stream) until it is
// back. The first connection is tried in the background too, so that a
// process can start while the broker is down.
//
// A refused login is tried again too, as the client would not by default
// (it gives up after the same refusal twice, and the connection stays
// closed for good): the broker's users may be set up after the process
// starts. Meanwhile LoginRefused says so, and the refusal is logged
// naming the NATS user. A publish made while there is no connection fails
// at once rather than waiting in the client's buffer: its caller then
// knows that nothing left (NotSent). The client's own asynchronous errors
// (a slow consumer, a permission the broker refused) go to log, as JSON
// like every other line, instead of to standard error.
func Connect(log *slog.Logger, cfg Config) (*Conn, error) {
	c := &Conn{user: cfg.User, log: log.With(slog.String("nats_user", cfg.User)), onRefused: cfg.OnLoginRefused}
	nc, err := nats.Connect(cfg.URL,
		nats.Name(cfg.Name),
		nats.UserInfo(cfg.User, string(cfg.Password)),
		nats.CustomInboxPrefix(InboxPrefix(cfg.User)),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.Timeout(2*time.Second),
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(*nats.Conn) { c.accepted() }),
		nats.ReconnectHandler(func(*nats.Conn) { c.accepted() }),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { c.failed(err) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) { c.async(sub, err) }),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", Redacted(cfg.URL), err)
	}
	c.Conn = nc
	return c, nil
}

// LoginRefused is the broker's refusal of this process's login (wrapping
// ErrLoginRefused), or nil: accepted, or not refused since it last was.
func (c *Conn) LoginRefused() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused == nil {
		return nil
	}
	return fmt.Errorf("%w (NATS user %s): %w", ErrLoginRefused, c.user, c.refused)
}

// refusedEvery is how often, at most, a refused login is logged.
const refusedEvery = 10 * time.Second

func (c *Conn) accepted() {
	c.mu.Lock()
	was := c.refused
	c.refused = nil
	c.mu.Unlock()
	if was != nil {
		c.log.Info("broker: the login is accepted again")
	}
}

func (c *Conn) failed(err error) {
	if !authError(err) {
		return // the broker is down or unreachable: its callers say so
	}
	c.mu.Lock()
	c.refused = err
	c.mu.Unlock()
	if c.onRefused != nil {
		c.onRefused()
	}
	if n, ok := c.refusedAlarm.Ring(time.Now(), refusedEvery); ok {
		c.log.Error("broker: the broker refuses this process's NATS login: the password is wrong, or the broker has no such user; "+
			"nothing is published or read until it is fixed", slog.String("error", err.Error()), slog.Int("refusals_since_last_log", n))
	}
}

// asyncEvery is how often, at most, the client's asynchronous errors are
// logged.
const asyncEvery = 10 * time.Second

func (c *Conn) async(sub *nats.Subscription, err error) {
	if authError(err) {
		c.failed(err)
		return
	}
	n, ok := c.asyncAlarm.Ring(time.Now(), asyncEvery)
	if !ok {
		return
	}
	attrs := []any{slog.String("error", err.Error()), slog.Int("errors_since_last_log", n)}
	if sub != nil {
		attrs = append(attrs, slog.String("subject", sub.Subject))
	}
	msg := "broker: the client reports an error"
	if errors.Is(err, nats.ErrSlowConsumer) {
		// Messages the client dropped are delivered again by the broker
		// once their ack wait ends: late, not lost.
		msg = "broker: the client dropped messages it could not hand over in time (slow consumer); the broker delivers them again after their ack wait"
	}
	c.log.Warn(msg, attrs...) // the client's callback has no context
}

// authError says whether err is the broker refusing a login.
func authError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) ||
		errors.Is(err, nats.ErrAccountAuthExpired) || err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

// NotSent says whether a publish failed before anything left this
// process: there was no connection to send it on (Connect buffers
// nothing meanwhile; before the first connection the client cannot even
// know that the server takes headers), or the connection was closed. Such
// a publish cannot have reached the stream, let alone its reader.
func NotSent(err error) bool {
	for _, e := range []error{nats.ErrReconnectBufExceeded, nats.ErrConnectionClosed, nats.ErrNoServers,
		nats.ErrConnectionReconnecting, nats.ErrDisconnected, nats.ErrHeadersNotSupported} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
