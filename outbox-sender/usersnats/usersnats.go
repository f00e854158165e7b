// Package usersnats is the outbox sender's transport to Users through NATS
// JetStream (SENDER_TRANSPORT=nats): it publishes each row's create-user
// command to the command stream, with the row's idempotency key as
// Idempotency-Key and a message id of its own for each publish meant to
// reach Users (MessageID), and reads Users' answers from the reply stream.
//
// A publish the broker acknowledged is not a delivery: the row waits as
// published (Deliver's verdict is relay.Published) until Users' answer
// comes back, and is published again, under the same key, if none comes
// within SENDER_NATS_ANSWER_WAIT (growing with the attempts). Users'
// answer links the student through the sender's inbox of replies
// (relay.Engine.RecordReplies), once however often the broker delivers it.
package usersnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/alarm"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/telemetry"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// Config is what the transport needs of the sender's configuration.
type Config struct {
	NATS natsbus.Config // SENDER_NATS_URL, SENDER_NATS_PASSWORD
	// Timeout bounds each publish, its acknowledgement included.
	Timeout time.Duration // SENDER_REQUEST_TIMEOUT
	// AnswerWait is the least a published row waits for Users' answer
	// before it is published again.
	AnswerWait time.Duration // SENDER_NATS_ANSWER_WAIT
	// Workers is how many batches of replies are recorded at once.
	Workers int
}

// MaxReplyDeliveries is how often the sender reads a reply it cannot
// decode, a second apart, before it parks it: a reply from a newer Users
// may be one a newer sender, rolling out beside this one, can read.
// Parked, the reply is kept in parked_replies and terminated on the
// broker: left unacknowledged, it would hold one of the consumer's pending
// slots for good, and enough of them would stop the reading of replies.
const MaxReplyDeliveries = 5

// Recorder records replies, or parks one the sender cannot read:
// relay.Engine.
type Recorder interface {
	RecordReplies(ctx context.Context, replies []relay.Reply) ([]string, error)
	ParkReply(ctx context.Context, p store.ParkedReply) error
}

// Transport publishes commands and reads replies on one connection.
type Transport struct {
	cfg   Config
	log   *slog.Logger
	nc    *natsbus.Conn
	js    jetstream.JetStream
	alarm alarm.Alarm
	// publish is one publish, from sending to the broker's
	// acknowledgement (or failure).
	publish prometheus.Histogram
	// duplicates counts publishes the broker acknowledged as copies of
	// one it held (the same message id within its de-duplication window):
	// publishes whose recording was lost, sent again.
	duplicates prometheus.Counter
	// undecodable counts replies parked.
	undecodable prometheus.Counter
	// authFailures counts publishes refused because the broker refuses
	// the sender's login: the same counter as the HTTP transport's, so
	// that one alert covers both.
	authFailures *prometheus.CounterVec

	// floor caches how far Users has read the command stream: the last
	// look's result (or failure) and when it came, and the look in
	// flight, if any (closed when it ends).
	floor struct {
		sync.Mutex
		read
		err      error
		at       time.Time
		inFlight chan struct{}
	}
}

// New connects to the broker. The connection is made in the background
// when the broker is down: publishes fail (rows wait, retried) until it
// is up.
func New(log *slog.Logger, cfg Config) (*Transport, error) {
	nc, err := natsbus.Connect(log, cfg.NATS)
	if err != nil {
		return nil, err
	}
	// The timeout ends a publish whose acknowledgement never comes (lost
	// with a connection) within the client as well as for its caller.
	js, err := jetstream.New(nc.Conn, jetstream.WithPublishAsyncTimeout(cfg.Timeout))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Transport{
		cfg: cfg, log: log, nc: nc, js: js,
		publish: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_sender_publish_duration_seconds",
			Help:    "Time from publishing a row's command to the broker's acknowledgement (or failure), SENDER_TRANSPORT=nats.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12),
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_sender_publish_duplicates_total",
			Help: "Publishes the broker acknowledged as repeats of a command it holds (same key within its de-duplication window).",
		}),
		undecodable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_sender_replies_undecodable_total",
			Help: "Replies the sender could not read after " + strconv.Itoa(MaxReplyDeliveries) + " deliveries, parked in parked_replies: alert on any increase.",
		}),
		authFailures: newAuthFailures(),
	}, nil
}

// AuthStatus is the status label of a publish refused for the sender's
// NATS login, beside the HTTP transport's 401 and 403.
const AuthStatus = "nats"

func newAuthFailures() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_sender_auth_failures_total",
		Help: "Deliveries refused for the sender's credentials, by status: 401 or 403 from Users, nats when the broker refuses the sender's login. A misconfiguration: alert on any increase.",
	}, []string{"status"})
	c.WithLabelValues(AuthStatus) // from the start, so that increase() sees the first
	return c
}

// Collectors returns the transport's metrics.
func (t *Transport) Collectors() []prometheus.Collector {
	return []prometheus.Collector{t.publish, t.duplicates, t.undecodable, t.authFailures}
}

// Ready is nil unless the broker refuses the sender's login: a sender in
// that state can neither publish nor read a reply, and its /readyz says
// so. A broker that is down is not a reason: rows wait in the outbox.
func (t *Transport) Ready() error { return t.nc.LoginRefused() }

// Close closes the connection.
func (t *Transport) Close() { t.nc.Close() }

// Deliver publishes one row's command and waits for the broker's
// acknowledgement, within SENDER_REQUEST_TIMEOUT also when ctx ends (a
// publish the broker took is better recorded now).
//
// A row published before is published again only once Users has read the
// command it was published with (relay.Unread otherwise): its answer was
// lost, or Users could not act on it. While Users is down, a command it
// has not read will get its answer when Users is back; a second copy
// would only wait behind it, and past JetStream's de-duplication window
// the broker would store every copy.
func (t *Transport) Deliver(ctx context.Context, row store.Row) relay.Answer {
	if row.PublishedSeq > 0 {
		r, err := t.readSoFar(ctx, t.lookUpBy(row))
		switch {
		case err != nil:
			// Better a copy too many than a row that never moves: Users'
			// inbox answers a key once.
			t.warn("look up how far Users has read the commands; publishing again regardless", err)
		case r.unread(row.PublishedSeq):
			return relay.Answer{Verdict: relay.Unread, RetryAfter: t.cfg.AnswerWait}
		}
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Timeout)
	defer cancel()
	key := row.IdempotencyKey.String()
	header := nats.Header{}
	header.Set(natsbus.HeaderAttempt, strconv.Itoa(row.Attempts))
	if !row.ExpiresAt.IsZero() {
		header.Set(natsbus.HeaderExpires, row.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	telemetry.Inject(pctx, natsbus.HTTPHeader(header)) // Users continues the attempt's trace
	start := time.Now()
	ack := natsbus.Publish(pctx, t.js, natsbus.CommandStream, []natsbus.Message{{
		Subject: natsbus.CreateUserSubject, ID: MessageID(row), Key: key, Data: row.Payload, Header: header,
	}})[0]
	t.publish.Observe(time.Since(start).Seconds())
	if err := ack.Err; err != nil {
		return t.failed(err)
	}
	if ack.Duplicate {
		t.duplicates.Inc()
	}
	return relay.Answer{Verdict: relay.Published, Seq: ack.Seq, Repeat: ack.Duplicate, RetryAfter: t.cfg.AnswerWait}
}

// MessageID is the Nats-Msg-Id of the row's next command: its key and the
// count of its recorded publishes. A publish repeated because its outcome
// is unknown (the acknowledgement lost, the sender killed before it
// recorded it) goes out under the same id, and the broker drops the copy
// within its de-duplication window. A publish meant to reach Users again
// (the last one read and not answered, or a redrive, which counts as a
// publish) has a new id: with the key alone, the broker dropped such a
// publish for two minutes, and a redrive sat published, reaching nobody.
func MessageID(row store.Row) string {
	return row.IdempotencyKey.String() + "." + strconv.Itoa(row.Publishes)
}

// failed judges a publish the broker did not acknowledge. Unsent, when
// nothing reached the stream: no connection to send on (natsbus.Connect
// buffers nothing meanwhile), a refused login, a full stream that refused
// the command. A publish that went out and whose acknowledgement never
// came may have reached Users, and counts as an attempt.
func (t *Transport) failed(err error) relay.Answer {
	what := fmt.Sprintf("publish to %s: %v", natsbus.CreateUserSubject, err)
	switch refused := t.nc.LoginRefused(); {
	case refused != nil:
		t.authFailures.WithLabelValues(AuthStatus).Inc()
		return relay.Answer{Verdict: relay.Transient, Class: outbox.ReasonBrokerAuthRefused, Unsent: true,
			Error: fmt.Sprintf("publish to %s: %v (check SENDER_NATS_PASSWORD)", natsbus.CreateUserSubject, refused)}
	case natsbus.StreamFull(err):
		return relay.Answer{Verdict: relay.Transient, Class: outbox.ReasonBrokerFull, Unsent: true, Error: what}
	case natsbus.NotSent(err):
		return relay.Answer{Verdict: relay.Transient, Class: outbox.ReasonBrokerUnreachable, Unsent: true,
			Error: fmt.Sprintf("publish to %s: no connection to the broker at %s, nothing sent (%v)", natsbus.CreateUserSubject, natsbus.Redacted(t.cfg.NATS.URL), err)}
	}
	return relay.Answer{Verdict: relay.Transient, Class: outbox.ReasonBrokerUnreachable, Error: what}
}

// floorFresh is how long a look at the command stream is used for. The
// floor only moves forward (a consumer made anew starts again from the
// stream's oldest command, unread), so an older floor holds a row back a
// little longer, never publishes one too soon. The stream's newest
// sequence does grow: a row published after the look seems past it, and
// is published again, which only happens with an answer wait shorter than
// the look's age, and which JetStream's de-duplication window drops.
const floorFresh = time.Second

// read is how far Users has read the command stream.
type read struct {
	// floor is the sequence up to which Users' durable consumer has
	// acknowledged every command (its ack floor).
	floor uint64
	// last is the stream's newest sequence.
	last uint64
}

// unread says whether the command at seq may not have been read yet: it
// is past the floor, and the stream can still hold it. Commands Users
// acknowledged out of order, past a slower one, count as unread until the
// floor passes them. A sequence past the stream's newest is from a stream
// since deleted and made anew: its command is gone, and is published
// again.
func (r read) unread(seq uint64) bool { return r.floor < seq && seq <= r.last }

// lookUpBy is how long the publishing of row may wait for a look at the
// command stream: its publish must still end within the claim's lease
// (each publish is bounded by SENDER_REQUEST_TIMEOUT), so that no command
// goes out under a lease another sender may hold by then.
func (t *Transport) lookUpBy(row store.Row) time.Time {
	if row.LeaseEnds.IsZero() {
		return time.Now().Add(t.cfg.Timeout)
	}
	return row.LeaseEnds.Add(-t.cfg.Timeout)
}

// readSoFar returns how far Users has read the command stream, waiting
// until by at most. One look serves every row for floorFresh, a failed
// look too; rows that come while a look is under way wait for that one,
// not for one each. The look runs apart from the callers, so that one
// caller's end does not fail it for the others.
func (t *Transport) readSoFar(ctx context.Context, by time.Time) (read, error) {
	f := &t.floor
	f.Lock()
	if !f.at.IsZero() && time.Since(f.at) < floorFresh {
		defer f.Unlock()
		return f.read, f.err
	}
	if f.inFlight == nil {
		done := make(chan struct{})
		f.inFlight = done
		// Not bound to this caller's end: the others wait for it too.
		lookCtx := context.WithoutCancel(ctx)
		go func() {
			lctx, cancel := context.WithTimeout(lookCtx, t.cfg.Timeout)
			r, err := t.lookUp(lctx)
			cancel()
			f.Lock()
			f.read, f.err, f.at, f.inFlight = r, err, time.Now(), nil
			f.Unlock()
			close(done)
		}()
	}
	done := f.inFlight
	f.Unlock()
	wctx, cancel := context.WithDeadline(ctx, by)
	defer cancel()
	select {
	case <-done:
		f.Lock()
		defer f.Unlock()
		return f.read, f.err
	case <-wctx.Done():
		return read{}, errors.New("no answer from the broker in time")
	}
}

func (t *Transport) lookUp(ctx context.Context) (read, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	// The consumer first: a command published between the two looks is
	// then past the floor and within the stream, unread, as it is.
	cons, err := t.js.Consumer(ctx, natsbus.CommandStream, natsbus.UsersConsumer)
	if err != nil {
		return read{}, fmt.Errorf("consumer %s on %s: %w", natsbus.UsersConsumer, natsbus.CommandStream, err)
	}
	stream, err := t.js.Stream(ctx, natsbus.CommandStream)
	if err != nil {
		return read{}, fmt.Errorf("stream %s: %w", natsbus.CommandStream, err)
	}
	return read{floor: cons.CachedInfo().AckFloor.Stream, last: stream.CachedInfo().State.LastSeq}, nil
}

func (t *Transport) warn(what string, err error) {
	if n, ok := t.alarm.Ring(time.Now(), warnEvery); ok {
		t.log.Warn(what, slog.String("error", err.Error()), slog.Int("failures_since_last_log", n))
	}
}
