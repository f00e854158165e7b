package sender

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/usersnats"
	"github.com/outboxref/outboxref/testkit/natsserver"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// These tests run the relay with SENDER_TRANSPORT=nats against a real
// PostgreSQL and an embedded NATS server, with a stand-in Users that reads
// the command stream as Users' NATS user and answers on the reply stream.

func natsConfig(srv *natsserver.Server) Config {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Transport = TransportNATS
	cfg.NATSURL = srv.URL
	cfg.NATSPassword = srv.Passwords[natsbus.SenderUser]
	cfg.NATSAnswerWait = 200 * time.Millisecond
	return cfg
}

// brokerUsers is a Users stand-in on the broker: answer decides the reply
// to each command (status and body), given its key and how many times the
// key came (from 1); nil answer: no reply at all.
type brokerUsers struct {
	t       *testing.T
	js      jetstream.JetStream
	mu      sync.Mutex
	seen    map[string]int
	users   map[string]uuid.UUID
	expires map[string]string // each key's last Outbox-Expires
	answer  func(key string, n int) (int, any)
}

func newBrokerUsers(t *testing.T, srv *natsserver.Server, answer func(key string, n int) (int, any)) *brokerUsers {
	t.Helper()
	nc, err := natsbus.Connect(slog.New(slog.DiscardHandler), srv.Config(natsbus.UsersUser, "stand-in users"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc.Conn)
	require.NoError(t, err)
	b := &brokerUsers{t: t, js: js, seen: map[string]int{}, users: map[string]uuid.UUID{}, expires: map[string]string{}, answer: answer}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, natsbus.CommandStream, natsbus.UsersConsumer)
	require.NoError(t, err)
	cc, err := cons.Consume(b.handle)
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	return b
}

func (b *brokerUsers) handle(m jetstream.Msg) {
	key := m.Headers().Get(natsbus.HeaderKey)
	b.mu.Lock()
	b.seen[key]++
	n := b.seen[key]
	b.expires[key] = m.Headers().Get(natsbus.HeaderExpires)
	if _, ok := b.users[key]; !ok {
		b.users[key] = uuid.Must(uuid.NewV7())
	}
	user := b.users[key]
	b.mu.Unlock()
	status, body := http.StatusCreated, any(map[string]any{"userId": user, "status": "created"})
	if b.answer != nil {
		status, body = b.answer(key, n)
	}
	if status != 0 {
		b.reply(key, uuid.New(), status, body)
	}
	_ = m.Ack()
}

// reply publishes an answer for key with the reply id id.
func (b *brokerUsers) reply(key string, id uuid.UUID, status int, body any) {
	raw, err := json.Marshal(body)
	require.NoError(b.t, err)
	data, err := json.Marshal(natsbus.Reply{IdempotencyKey: uuid.MustParse(key), Status: status, Body: raw})
	require.NoError(b.t, err)
	msg := nats.NewMsg(natsbus.CreateUserReplySubject)
	msg.Data = data
	msg.Header.Set(natsbus.HeaderKey, key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id.String()))
	require.NoError(b.t, err)
}

func (b *brokerUsers) deliveries(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[key]
}

// sawEach says whether every one of keys came at least n times.
func (b *brokerUsers) sawEach(keys []string, n int) bool {
	for _, k := range keys {
		if b.deliveries(k) < n {
			return false
		}
	}
	return true
}

func (b *brokerUsers) userFor(key string) uuid.UUID {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.users[key]
}

// brokerWith starts a broker whose streams are provisioned with the
// defaults as change leaves them, and returns it with an admin's
// connection to it.
func brokerWith(t *testing.T, change func(*natsbus.Streams)) (*natsserver.Server, jetstream.JetStream) {
	t.Helper()
	srv := natsserver.ForTest(t)
	_, js := srv.Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	streams := natsserver.LocalStreams
	change(&streams)
	require.NoError(t, natsbus.Provision(ctx, js, streams))
	return srv, js
}

func keysOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT idempotency_key::text FROM outbox ORDER BY id")
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

func TestBrokerPublishesAndLinksFromReplies(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	users := newBrokerUsers(t, srv, nil)
	ids := addStudents(t, pool, 30)
	r := run(t, pool, natsConfig(srv))

	deliveredWithin(t, pool, len(ids), patience, "every row delivered from Users' replies")
	for _, key := range keysOf(t, pool) {
		var user uuid.UUID
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT s.user_id FROM outbox o JOIN students s ON s.id = o.student_id WHERE o.idempotency_key = $1", key).Scan(&user))
		require.Equal(t, users.userFor(key), user, "the student is linked to the user Users answered with")
		// One command per row, unless an answer took longer than the
		// test's short SENDER_NATS_ANSWER_WAIT (a busy machine): the row
		// was then published again, and Users answered the key again.
		require.GreaterOrEqual(t, users.deliveries(key), 1)
		var expires time.Time
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT age_from + interval '1 hour' FROM outbox WHERE idempotency_key = $1", key).Scan(&expires))
		users.mu.Lock()
		header := users.expires[key]
		users.mu.Unlock()
		require.Equal(t, expires.UTC().Format(time.RFC3339Nano), header, "the command says when its row expires (SENDER_MAX_AGE after age_from)")
	}
	require.Equal(t, len(ids), count(t, pool, "SELECT count(*) FROM reply_inbox WHERE outcome = 'linked'"))
	require.Equal(t, len(ids), count(t, pool, "SELECT count(*) FROM outbox_events WHERE kind = 'reply' AND outcome = 'delivered'"))
	// A reply can overtake the recording of its own publish: the row is
	// delivered by then, and the publish's recording leaves it alone.
	require.Equal(t, len(ids), count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered' AND lease_token IS NULL"))
	// The counters move after the commits the checks above see: read them
	// once the sender has stopped, when every recording is done.
	r.wait(t)
	// Each publish was a message of its own: none dropped as a repeat.
	publishes, _ := r.histogram(t, "outbox_sender_publish_duration_seconds")
	require.GreaterOrEqual(t, publishes, uint64(len(ids)))
	require.Zero(t, r.metric(t, "outbox_sender_publish_duplicates_total"))
	require.InDelta(t, float64(len(ids)), r.metric(t, "outbox_sender_replies_total", "outcome", store.ReplyLinked), 0)
	require.InDelta(t, float64(len(ids)), r.metric(t, "outbox_sender_results_total", "verdict", outbox.OutcomeDelivered), 0,
		"a linking reply counts as a settlement")
}

// The broker delivers a reply at least once, and Users may relay the same
// answer twice (a crash between its publish and its bookkeeping): the
// sender's inbox of replies applies each reply once, and a second answer
// for a settled row changes nothing.
func TestBrokerRepliesApplyOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	replyID := uuid.New()
	var users *brokerUsers
	users = newBrokerUsers(t, srv, func(key string, n int) (int, any) {
		body := map[string]any{"userId": users.userFor(key), "status": "created"}
		// The same reply twice, under one id: the second is a repeat.
		users.reply(key, replyID, http.StatusCreated, body)
		return 0, nil
	})
	addStudents(t, pool, 1)
	r := run(t, pool, natsConfig(srv))
	deliveredWithin(t, pool, 1, patience, "the row delivered")
	key := keysOf(t, pool)[0]

	// JetStream's window would drop a publish with the same Nats-Msg-Id:
	// the repeat the inbox must catch is one the window let through, so
	// it is sent under an id the window has not seen, as a redelivery
	// after a consumer's failed ack would come. The row's own inbox row
	// is keyed by reply id: a second reply for the key is a new one, and
	// finds the row settled.
	users.reply(key, uuid.New(), http.StatusCreated, map[string]any{"userId": users.userFor(key)})
	eventually(t, "the second reply read", func() bool { return count(t, pool, "SELECT count(*) FROM reply_inbox") == 2 })
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM reply_inbox WHERE outcome = 'already-settled'"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE kind = 'reply'"), "a settled row gets no second event")

	// A different user for the same key settles nothing either: the row
	// is delivered, and the student keeps its user.
	users.reply(key, uuid.New(), http.StatusCreated, map[string]any{"userId": uuid.New()})
	eventually(t, "the third reply read", func() bool { return count(t, pool, "SELECT count(*) FROM reply_inbox") == 3 })
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE user_id = $1", users.userFor(key)))
	// Counted just after the commit the checks above see.
	eventually(t, "the third reply counted", func() bool {
		return r.metric(t, "outbox_sender_replies_total", "outcome", store.ReplySettled) == 2
	})
	require.InDelta(t, 1, r.metric(t, "outbox_sender_replies_total", "outcome", store.ReplyLinked), 0)
}

// Users' refusals come back as the problems the HTTP hop would answer, and
// dead-letter their rows with the same reason classes.
func TestBrokerRefusalsDeadLetter(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	refusals := []struct {
		p     *httpapi.Problem
		class string
	}{
		{httpapi.DocumentTaken("an enabled user already has this document number"), outbox.ReasonRefused},
		{httpapi.Validation(httpapi.FieldError{Field: "email", Detail: "not an email address"}), outbox.ReasonInvalid},
	}
	var mu sync.Mutex
	next := 0
	newBrokerUsers(t, srv, func(key string, n int) (int, any) {
		mu.Lock()
		defer mu.Unlock()
		p := refusals[next%len(refusals)].p
		next++
		return p.Status, json.RawMessage(p.Body())
	})
	addStudents(t, pool, 4)
	run(t, pool, natsConfig(srv))
	eventually(t, "every row dead", func() bool { return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 4 })
	for _, r := range refusals {
		require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox WHERE reason_class = $1", r.class), r.class)
	}
	require.Zero(t, count(t, pool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL"))
}

// A command Users read and did not answer within SENDER_NATS_ANSWER_WAIT
// (its answer lost, say) is published again under the same key, as a new
// message, counted as an attempt: the broker must not drop it as a repeat
// of the last, or it would reach nobody until its de-duplication window
// ended (it used to, for two minutes, with the key as the message id).
// Users' inbox answers the key once whatever the message; the answer,
// whenever it comes, links the student.
func TestBrokerPublishesAgainWhenAnAnswerIsLost(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	users := newBrokerUsers(t, srv, func(string, int) (int, any) { return 0, nil }) // reads, never answers
	addStudents(t, pool, 1)
	r := run(t, pool, natsConfig(srv))
	key := ""
	eventually(t, "the command published three times, each one read by Users", func() bool {
		if key == "" {
			if keys := keysOf(t, pool); len(keys) == 1 {
				key = keys[0]
			}
		}
		return key != "" && users.deliveries(key) >= 3
	})
	require.Zero(t, r.metric(t, "outbox_sender_publish_duplicates_total"), "no publish was dropped as a repeat")
	require.GreaterOrEqual(t, count(t, pool, "SELECT attempts FROM outbox"), 3, "each a counted attempt")
	require.GreaterOrEqual(t, count(t, pool, "SELECT publishes FROM outbox"), 3)
	eventually(t, "the waiting row's age is shown while it is published", func() bool {
		return r.metric(t, "outbox_oldest_published_age_seconds") > 0
	})

	users.reply(key, uuid.New(), http.StatusCreated, map[string]any{"userId": users.userFor(key)})
	deliveredWithin(t, pool, 1, patience, "the late answer links the student")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE user_id = $1", users.userFor(key)))
}

// A retry redrive inside JetStream's de-duplication window reaches Users:
// the redrive is a publish of its own, under a new message id. Users
// refuses the key (its document number taken), the row dies, the operator
// redrives it at once, and Users hears the key a second time and answers
// again; before, the broker dropped the republish as a repeat and the row
// sat published, its attempts spent on nobody.
func TestBrokerRedriveReachesUsers(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	taken := httpapi.DocumentTaken("an enabled user already has this document number")
	var users *brokerUsers
	users = newBrokerUsers(t, srv, func(key string, n int) (int, any) {
		if n == 1 {
			return taken.Status, json.RawMessage(taken.Body())
		}
		return http.StatusCreated, map[string]any{"userId": users.userFor(key), "status": "created"}
	})
	addStudents(t, pool, 1)
	// The redrive is the only second publish: with the shared 200ms wait,
	// a loaded machine answered the first publish after the row was
	// published again, and that second answer linked the row before the
	// redrive.
	cfg := natsConfig(srv)
	cfg.NATSAnswerWait = time.Minute
	run(t, pool, cfg)
	eventually(t, "the row dead, refused", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND reason_class = $1", outbox.ReasonRefused) == 1
	})
	key := keysOf(t, pool)[0]
	_, err := deadletter.New(asSender(t, pool), "test-operator", 3*time.Second).Redrive(context.Background(),
		int64(count(t, pool, "SELECT id FROM outbox")), outbox.RedriveRetry, false)
	require.NoError(t, err)
	deliveredWithin(t, pool, 1, patience, "the redrive reached Users, whose second answer links the student")
	require.Equal(t, 2, users.deliveries(key), "Users heard the key twice: once before the redrive, once after")
}

// With the broker unreachable, publishes fail at once: nothing left the
// sender, so no attempt is counted and SENDER_MAX_ATTEMPTS (1 here) does
// not dead-letter a row that never reached the broker. The rows are
// retried as broker-unreachable, and their history says so.
func TestBrokerUnreachableRetries(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	cfg := natsConfig(srv)
	cfg.NATSURL = "nats://127.0.0.1:1" // nothing listens there
	cfg.MaxAttempts = 1
	addStudents(t, pool, 3)
	run(t, pool, cfg)
	eventually(t, "every row retried twice as broker-unreachable", func() bool {
		return count(t, pool, "SELECT count(DISTINCT outbox_id) FROM outbox_events WHERE outcome = 'retry' AND reason_class = $1 AND outbox_id IN "+
			"(SELECT outbox_id FROM outbox_events GROUP BY outbox_id HAVING count(*) >= 2)", outbox.ReasonBrokerUnreachable) == 3
	})
	// Waited for, not read once: a row the sender is claiming again at
	// that moment is between its claim and its recording. A counted
	// attempt or a death never goes back, so this still fails on either.
	eventually(t, "nothing was sent: no attempt counted, none dead", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending' AND attempts = 0 AND reason_class = $1",
			outbox.ReasonBrokerUnreachable) == 3
	})
}

// A wrong NATS password is told apart from a broker that is down: the
// rows' reason is broker-auth-refused (retried, never counted, never
// dead), the refusal is counted beside the HTTP transport's, an error
// line names the NATS user, and /readyz says the sender cannot log in to
// the broker. The right password, once the broker has it, heals it all.
func TestBrokerRefusesTheSendersLogin(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	cfg := natsConfig(srv)
	cfg.NATSPassword = "not-the-senders-password"
	cfg.MaxAttempts = 1
	addStudents(t, pool, 2)
	r, logs := runLogged(t, pool, cfg)
	eventually(t, "rows retried as broker-auth-refused", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending' AND attempts = 0 AND reason_class = $1",
			outbox.ReasonBrokerAuthRefused) == 2
	})
	require.Positive(t, r.metric(t, "outbox_sender_auth_failures_total", "status", usersnats.AuthStatus))
	eventually(t, "the refusal logged", func() bool {
		return len(logLines(t, logs.String(), "broker: the broker refuses this process's NATS login: the password is wrong, or the broker has no such user; "+
			"nothing is published or read until it is fixed")) > 0
	})
	line := logLines(t, logs.String(), "broker: the broker refuses this process's NATS login: the password is wrong, or the broker has no such user; "+
		"nothing is published or read until it is fixed")[0]
	require.Equal(t, natsbus.SenderUser, line["nats_user"])
	require.Equal(t, "ERROR", line["level"])

	admin := adminRouter(quiet, asSender(t, pool), r.Relay)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/readyz", nil)
	req.Host = "localhost"
	admin.ServeHTTP(rec, req)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `"broker":"down"`)
	require.Contains(t, rec.Body.String(), "the broker refuses the sender's NATS login (user outbox-sender): check SENDER_NATS_PASSWORD")
}

// The sender's reply consumer deleted and provisioned again (an operator
// re-running provision-broker after a change): the reader looks it up
// again, and answers published afterwards still link their students.
func TestBrokerReplyReaderOutlivesReprovisioning(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	users := newBrokerUsers(t, srv, func(string, int) (int, any) { return 0, nil }) // answers by hand below
	addStudents(t, pool, 1)
	_, logs := runLogged(t, pool, natsConfig(srv))
	eventually(t, "the row published", func() bool { return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'published'") == 1 })

	_, js := srv.Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, js.DeleteConsumer(ctx, natsbus.ReplyStream, natsbus.SenderConsumer))
	require.NoError(t, natsbus.Provision(ctx, js, natsserver.LocalStreams))

	key := keysOf(t, pool)[0]
	users.reply(key, uuid.New(), http.StatusCreated, map[string]any{"userId": users.userFor(key)})
	deliveredWithin(t, pool, 1, patience, "the answer read through the re-created consumer")
	require.NotEmpty(t, logLines(t, logs.String(), "the reply consumer stopped delivering (deleted or re-created?); looking it up again"),
		"the reader noticed its consumer went away")
}

// A row is published again only once Users has read the command it was
// published with. While nobody reads the command stream (Users down), the
// row waits, its claims not counted as attempts, and the stream keeps one
// command per row even past JetStream's de-duplication window. Once Users
// has read the command and the answer still does not come (lost), the row
// is published again.
func TestBrokerHoldsBackAnUnreadCommand(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	// A window shorter than the answer wait: without the hold, every
	// publish again would be stored.
	srv, js := brokerWith(t, func(s *natsbus.Streams) { s.Duplicates = 100 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// stored is how many commands the stream has taken so far (read ones
	// leave it).
	stored := func() uint64 {
		s, err := js.Stream(ctx, natsbus.CommandStream)
		require.NoError(t, err)
		return s.CachedInfo().State.LastSeq
	}

	addStudents(t, pool, 3)
	cfg := natsConfig(srv)
	cfg.BackoffMin, cfg.BackoffMax = 50*time.Millisecond, 400*time.Millisecond
	r := run(t, pool, cfg)
	eventually(t, "the rows held back unread a few times", func() bool {
		return r.metric(t, "outbox_sender_results_total", "verdict", outbox.OutcomeUnread) >= 9
	})
	require.Equal(t, uint64(3), stored(), "one command per row in the stream")
	require.Equal(t, 3, count(t, pool, "SELECT count(*) FROM outbox WHERE state IN ('published', 'pending') AND attempts = 1"),
		"a row held back unread used no attempt")
	require.Equal(t, 0, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outcome = 'unread'"), "nothing sent, nothing in the history")

	// Users reads every command and its answers are lost: the rows are
	// published again, each under its own key.
	users := newBrokerUsers(t, srv, func(string, int) (int, any) { return 0, nil })
	keys := keysOf(t, pool)
	eventually(t, "every row published again once read", func() bool { return users.sawEach(keys, 2) })
	require.Greater(t, stored(), uint64(3))

	for _, k := range keys {
		users.reply(k, uuid.New(), http.StatusCreated, map[string]any{"userId": users.userFor(k)})
	}
	deliveredWithin(t, pool, 3, patience, "the answers link the students")
}

// When the sender cannot tell how far Users has read (here Users'
// consumer is gone, deleted by an operator), it publishes a row again
// rather than hold it for ever. With no consumer the command stream keeps
// nothing it is given, and JetStream drops a repeat within its
// de-duplication window as if it held the first (a short window here):
// only a publish past the window brings a command to the consumer made
// anew.
func TestBrokerPublishesAgainWhenItCannotLook(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	short := func(s *natsbus.Streams) { s.Duplicates = 100 * time.Millisecond }
	srv, js := brokerWith(t, short)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, js.DeleteConsumer(ctx, natsbus.CommandStream, natsbus.UsersConsumer))

	addStudents(t, pool, 2)
	cfg := natsConfig(srv)
	cfg.BackoffMin, cfg.BackoffMax = 50*time.Millisecond, 400*time.Millisecond
	cfg.MaxAttempts = 1000 // each publish again is an attempt
	_, logs := runLogged(t, pool, cfg)
	eventually(t, "the rows published again", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE attempts >= 3") == 2
	})
	require.NotEmpty(t, logLines(t, logs.String(), "look up how far Users has read the commands; publishing again regardless"))

	streams := natsserver.LocalStreams
	short(&streams)
	require.NoError(t, natsbus.Provision(ctx, js, streams))
	newBrokerUsers(t, srv, nil)
	deliveredWithin(t, pool, 2, patience, "the commands published to the consumer made anew are answered")
}

// A command stream at its byte limit refuses new commands: the rows wait
// in the outbox as broker-full, and go once Users has read enough to
// make room (read commands leave the stream).
func TestBrokerFullKeepsRowsInTheOutbox(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv, js := brokerWith(t, func(s *natsbus.Streams) { s.MaxBytes = 2048 }) // room for a few commands
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	addStudents(t, pool, 20)
	cfg := natsConfig(srv)
	cfg.BackoffMin, cfg.BackoffMax = 50*time.Millisecond, 200*time.Millisecond
	r := run(t, pool, cfg)
	eventually(t, "rows refused as broker-full", func() bool {
		return count(t, pool, fmt.Sprintf("SELECT count(*) FROM outbox WHERE state = 'pending' AND reason_class = '%s'", outbox.ReasonBrokerFull)) > 0
	})
	// Counted just after the commit the check above sees.
	eventually(t, "the refusals counted", func() bool {
		return r.metric(t, "outbox_sender_results_total", "verdict", outbox.OutcomeRetry, "reason_class", outbox.ReasonBrokerFull) > 0
	})
	s, err := js.Stream(ctx, natsbus.CommandStream)
	require.NoError(t, err)
	require.Less(t, s.CachedInfo().State.Msgs, uint64(20), "the stream holds what fits")

	// Users reads (the answers are left out: the reply stream has the
	// same small limit). Read commands leave the stream, and make room.
	users := newBrokerUsers(t, srv, func(string, int) (int, any) { return 0, nil })
	keys := keysOf(t, pool)
	eventually(t, "every row's command published once Users reads", func() bool { return users.sawEach(keys, 1) })
}

// A reply the sender cannot read is read a few times, then parked: kept
// in parked_replies for an operator and terminated on the broker (left
// unacknowledged, it would hold a pending slot of the consumer for good),
// counted, and the rest go on.
func TestBrokerParksAnUnreadableReply(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	users := newBrokerUsers(t, srv, nil)
	addStudents(t, pool, 1)
	r := run(t, pool, natsConfig(srv))

	msg := nats.NewMsg(natsbus.CreateUserReplySubject)
	msg.Data = []byte(`{"not":"a reply"}`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ack, err := users.js.PublishMsg(ctx, msg, jetstream.WithMsgID(uuid.NewString()))
	require.NoError(t, err)
	deliveredWithin(t, pool, 1, patience, "the other replies are read")
	eventually(t, "the unreadable reply parked", func() bool {
		return r.metric(t, "outbox_sender_replies_undecodable_total") == 1
	})
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM parked_replies WHERE stream = $1 AND stream_sequence = $2 AND data = $3 AND deliveries = $4",
		natsbus.ReplyStream, int64(ack.Sequence), msg.Data, usersnats.MaxReplyDeliveries))
	_, js := srv.Admin(t)
	eventually(t, "the parked reply gone from the stream", func() bool {
		s, err := js.Stream(ctx, natsbus.ReplyStream)
		require.NoError(t, err)
		return s.CachedInfo().State.Msgs == 0
	})
}

// Every metric docs/observability.md lists for the broker transport is
// served by a sender with SENDER_TRANSPORT=nats from its start.
func TestBrokerMetricsAreDocumented(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../docs/observability.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(page), "\n## The broker transport's metrics\n")
	require.True(t, ok, "docs/observability.md has no section on the broker transport's metrics")
	section, _, _ = strings.Cut(section, "\n## ")
	documented := regexp.MustCompile("(?m)^\\| `([a-z_]+)").FindAllStringSubmatch(section, -1)
	require.NotEmpty(t, documented)

	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	r := run(t, pool, natsConfig(srv))
	served := map[string]bool{}
	for _, f := range r.gather(t) {
		served[f.GetName()] = true
	}
	for _, m := range documented {
		require.True(t, served[m[1]], "%s is documented but not served", m[1])
	}
}

// With Users answering at once, a reply often overtakes the recording of
// its own publish, and a batch of replies and a recording want the same
// rows at the same moment. Both lock them in id order, so they wait for
// each other: no deadlock, which PostgreSQL would break after a second
// by failing one of them (before the recording of publishes locked its
// rows in order, a few thousand students met two or three). Not parallel:
// its load would starve the tests that measure how claims batch.
func TestBrokerRepliesAndRecordingsDoNotDeadlock(t *testing.T) {
	pool := pgtest.Pool(t, migrations.Student)
	srv := natsserver.ForTest(t)
	newBrokerUsers(t, srv, nil)
	_, logs := runLogged(t, pool, natsConfig(srv))
	for range 10 {
		addStudents(t, pool, 300)
		time.Sleep(300 * time.Millisecond)
	}
	// Three thousand students under -race took over a minute on two
	// loaded cores.
	deliveredWithin(t, pool, 3000, 3*time.Minute, "every student linked")
	require.NotContains(t, logs.String(), "deadlock detected")
}
