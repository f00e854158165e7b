package usersvc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

// brokerEnv is Users on a database of its own with its broker side running
// against an embedded NATS server; the test publishes commands as the
// sender does and reads the reply stream as the admin.
type brokerEnv struct {
	env
	broker *broker
	sender jetstream.JetStream // publishes as natsbus.SenderUser
	admin  jetstream.JetStream
}

// wait bounds every wait of these tests.
const wait = 30 * time.Second

// newBrokerEnv starts Users' broker side; tweak, when not nil, changes it
// before it starts.
func newBrokerEnv(t *testing.T, cfg Config, tweak func(*broker)) brokerEnv {
	t.Helper()
	srv := natsserver.ForTest(t)
	e := newEnv(t, cfg)
	if cfg.NATSCaller == "" {
		cfg.NATSCaller = "outbox-sender"
	}
	if cfg.CommandMaxDeliveries == 0 {
		cfg.CommandMaxDeliveries = 5
	}
	cfg.DatabaseTimeout = 10 * time.Second
	b := newBroker(e.srv, cfg, srv.Config(natsbus.UsersUser, "users-test"))
	b.commands.retryDelay, b.commands.unreadableDelay = 50*time.Millisecond, 50*time.Millisecond
	b.relay.poll = 100 * time.Millisecond
	if tweak != nil {
		tweak(b)
	}
	apitest.Start(t, b.run)

	nc, err := natsbus.Connect(slog.New(slog.DiscardHandler), srv.Config(natsbus.SenderUser, "sender-test"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	sender, err := jetstream.New(nc.Conn)
	require.NoError(t, err)
	_, admin := srv.Admin(t)
	return brokerEnv{env: e, broker: b, sender: sender, admin: admin}
}

// publish publishes a command as the sender would: data, with key as both
// Idempotency-Key (none when "") and Nats-Msg-Id, unless msgID is given (a
// republish JetStream must not drop as a duplicate).
func (e brokerEnv) publish(t *testing.T, key, data string, msgID ...string) {
	t.Helper()
	msg := nats.NewMsg(natsbus.CreateUserSubject)
	msg.Data = []byte(data)
	if key != "" {
		msg.Header.Set(natsbus.HeaderKey, key)
	}
	msg.Header.Set(natsbus.HeaderAttempt, "1")
	id := key
	if len(msgID) > 0 {
		id = msgID[0]
	}
	if id == "" {
		id = uuid.NewString()
	}
	e.publishMsg(t, msg, id)
}

func (e brokerEnv) publishMsg(t *testing.T, msg *nats.Msg, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := e.sender.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
	require.NoError(t, err)
}

// reply is a reply read back from the reply stream.
type reply struct {
	natsbus.Reply
	msgID, key string
}

// replies waits until the reply stream holds n replies and returns them.
func (e brokerEnv) replies(t *testing.T, n int) []reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := e.admin.Stream(ctx, natsbus.ReplyStream)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs >= uint64(n)
	}, wait, 20*time.Millisecond, "want %d replies", n)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(n), info.State.Msgs, "exactly %d replies", n)
	var out []reply
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		require.NoError(t, err)
		r, err := natsbus.DecodeReply(m.Data)
		require.NoError(t, err)
		require.Equal(t, natsbus.CreateUserReplySubject, m.Subject)
		out = append(out, reply{Reply: r, msgID: m.Header.Get(jetstream.MsgIDHeader), key: m.Header.Get(natsbus.HeaderKey)})
	}
	return out
}

// settled waits until Users acknowledged every command and published
// every answer.
func (e brokerEnv) settled(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cons, err := e.admin.Consumer(ctx, natsbus.CommandStream, natsbus.UsersConsumer)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		var unpublished int
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0 &&
			e.pool.QueryRow(ctx, "SELECT count(*) FROM answers WHERE published_at IS NULL").Scan(&unpublished) == nil && unpublished == 0
	}, wait, 20*time.Millisecond, "commands acknowledged and answers published")
}

func (e brokerEnv) outcome(name string) int {
	return int(testutil.ToFloat64(e.srv.metrics.commands.WithLabelValues(name)))
}

// TestCommandCreatesUserAndRepliesOnce: a command creates one user and one
// reply, 201 with the user's id, whose Nats-Msg-Id is its answer row's and
// whose Idempotency-Key is the command's. The same command published again
// (past JetStream's de-duplication, with another Nats-Msg-Id, as the
// sender does when a reply is overdue) replays: still one user, and a
// second reply with the same answer, so that the sender waiting for one
// gets it.
func TestCommandCreatesUserAndRepliesOnce(t *testing.T) {
	t.Parallel()
	e := newBrokerEnv(t, Config{}, nil)
	key := uuid.NewString()
	e.publish(t, key, ada)
	r := e.replies(t, 1)[0]
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, key, r.IdempotencyKey.String())
	require.Equal(t, key, r.key)
	var created CreatedUser
	require.NoError(t, json.Unmarshal(r.Body, &created))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM users WHERE id = $1", created.UserID))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM answers WHERE message_id::text = $1 AND published_at IS NOT NULL", r.msgID))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM inbox WHERE caller = 'outbox-sender' AND idempotency_key = $1 AND resource_id = $2", key, created.UserID))
	e.settled(t)

	e.publish(t, key, ada, uuid.NewString())
	require.Eventually(t, func() bool { return e.outcome(OutcomeReplayed) == 1 }, wait, 20*time.Millisecond)
	e.settled(t)
	replies := e.replies(t, 2)
	require.Len(t, replies, 2, "a reply to each message")
	require.NotEqual(t, replies[0].msgID, replies[1].msgID)
	require.Equal(t, string(replies[0].Body), string(replies[1].Body), "the stored answer, replayed")
	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, 2, e.count(t, "answers"))
	require.Equal(t, 1, e.outcome(OutcomeCreated))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT replays FROM inbox"))
}

// TestCommandReplaysAKeySentOverHTTP: a key the sender first sent over HTTP
// and then through the broker (a transport switched mid-flight) is the
// same operation: the broker's command replays the HTTP answer, and the
// reply names the user HTTP created.
func TestCommandReplaysAKeySentOverHTTP(t *testing.T) {
	t.Parallel()
	e := newBrokerEnv(t, Config{}, nil)
	key := uuid.NewString()
	res := e.create(t, key, ada)
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	e.publish(t, key, ada)
	r := e.replies(t, 1)[0]
	require.Equal(t, http.StatusCreated, r.Status)
	require.JSONEq(t, string(res.Body), string(r.Body), "the HTTP answer, replayed")
	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, 1, e.outcome(OutcomeReplayed))
}

// TestCommandRefusals: each refusal is answered with exactly the status
// and body the HTTP hop sends for the same request: a document number
// taken (409, stored in the inbox), a key reused with another request
// (422, naming the fields), a request that fails validation (400).
func TestCommandRefusals(t *testing.T) {
	t.Parallel()
	e := newBrokerEnv(t, Config{}, nil)
	// What HTTP answers, from a Users of its own, for the same requests.
	h := newEnv(t, Config{})
	require.Equal(t, http.StatusCreated, h.create(t, uuid.NewString(), ada).Status)
	taken := body("Ada Again", "ada2@example.com", "111-1")
	httpTaken := h.create(t, uuid.NewString(), taken)
	k := uuid.NewString()
	require.Equal(t, http.StatusCreated, h.create(t, k, body("Bob", "bob@example.com", "222-2")).Status)
	httpMismatch := h.create(t, k, body("Robert", "bob@example.com", "222-2"))
	invalid := body("Carol", "not-an-email", "333-3")
	httpInvalid := h.create(t, uuid.NewString(), invalid)

	e.publish(t, uuid.NewString(), ada)
	e.publish(t, uuid.NewString(), taken)
	key := uuid.NewString()
	e.publish(t, key, body("Bob", "bob@example.com", "222-2"))
	e.replies(t, 3)
	// Another Nats-Msg-Id: with the key's, JetStream would drop it within
	// its window as a duplicate, unanswered.
	e.publish(t, key, body("Robert", "bob@example.com", "222-2"), uuid.NewString())
	invalidKey := uuid.NewString()
	e.publish(t, invalidKey, invalid)
	e.publish(t, invalidKey, invalid, uuid.NewString()) // published again: answered again
	e.settled(t)
	replies := e.replies(t, 6)

	byStatus := map[int][]byte{}
	for _, r := range replies {
		byStatus[r.Status] = r.Body
	}
	for _, want := range []apitest.Response{httpTaken, httpMismatch, httpInvalid} {
		require.Contains(t, byStatus, want.Status)
		require.Equal(t, string(want.Body), string(byStatus[want.Status]), "status %d: the HTTP hop's body, to the byte", want.Status)
	}
	require.Equal(t, httpapi.TypeDocumentTaken, problemType(t, byStatus[http.StatusConflict]))
	require.Equal(t, httpapi.TypeIdempotencyMismatch, problemType(t, byStatus[http.StatusUnprocessableEntity]))
	require.Equal(t, httpapi.TypeValidation, problemType(t, byStatus[http.StatusBadRequest]))
	require.Equal(t, 2, e.count(t, "users"))
	require.Equal(t, 6, e.count(t, "answers"))
	for outcome, n := range map[string]int{OutcomeCreated: 2, OutcomeRefused: 1, OutcomeMismatch: 1, CommandInvalid: 2} {
		require.Equal(t, n, e.outcome(outcome), outcome)
	}
}

// TestExpiredCommandIsNotActedOn: a command read after its Outbox-Expires
// (one that waited in the stream past its row's max age) creates no user
// and writes no answer: the sender has given the row up. One that has not
// expired yet is applied as any other.
func TestExpiredCommandIsNotActedOn(t *testing.T) {
	t.Parallel()
	e := newBrokerEnv(t, Config{}, nil)
	command := func(key, data string, expires time.Time) *nats.Msg {
		msg := nats.NewMsg(natsbus.CreateUserSubject)
		msg.Data = []byte(data)
		msg.Header.Set(natsbus.HeaderKey, key)
		msg.Header.Set(natsbus.HeaderExpires, expires.UTC().Format(time.RFC3339Nano))
		return msg
	}
	late := uuid.NewString()
	e.publishMsg(t, command(late, ada, time.Now().Add(-time.Second)), late)
	inTime := uuid.NewString()
	e.publishMsg(t, command(inTime, body("Bob", "bob@example.com", "222-2"), time.Now().Add(time.Hour)), inTime)
	r := e.replies(t, 1)[0]
	require.Equal(t, inTime, r.key)
	require.Equal(t, http.StatusCreated, r.Status)
	e.settled(t)
	require.Equal(t, 1, e.outcome(CommandExpired))
	require.Equal(t, 1, e.count(t, "users"), "the expired command created nobody")
	require.Equal(t, 0, apitest.Count(t, e.pool, "SELECT count(*) FROM answers WHERE idempotency_key = $1", late))
	require.Equal(t, 0, apitest.Count(t, e.pool, "SELECT count(*) FROM inbox WHERE idempotency_key = $1", late))
	require.Len(t, e.replies(t, 1), 1, "and is not answered")
}

func problemType(t *testing.T, b []byte) string {
	t.Helper()
	var p httpapi.Problem
	require.NoError(t, json.Unmarshal(b, &p))
	return p.Type
}

// TestUnreadableCommandIsParked: commands Users cannot read (no key, not
// JSON) are delivered USERS_COMMAND_MAX_DELIVERIES times, then parked and
// terminated, with no answer; a good command published after them is
// answered meanwhile.
func TestUnreadableCommandIsParked(t *testing.T) {
	t.Parallel()
	// Parking each unreadable command takes two of these delays: long
	// enough that the good command, on a loaded machine, is answered
	// first.
	e := newBrokerEnv(t, Config{CommandMaxDeliveries: 3}, func(b *broker) {
		b.commands.unreadableDelay = 2 * time.Second
	})
	e.publish(t, "", ada)
	e.publish(t, uuid.NewString(), "{not json")
	key := uuid.NewString()
	e.publish(t, key, ada)
	r := e.replies(t, 1)[0]
	require.Equal(t, http.StatusCreated, r.Status)
	require.Less(t, e.count(t, "parked_commands"), 2, "the good command did not wait for the unreadable ones")

	require.Eventually(t, func() bool { return e.count(t, "parked_commands") == 2 }, wait, 20*time.Millisecond)
	e.settled(t)
	require.Equal(t, 2, apitest.Count(t, e.pool, "SELECT count(*) FROM parked_commands WHERE deliveries = 3 AND stream = $1", natsbus.CommandStream))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM parked_commands WHERE reason = 'no Idempotency-Key header'"))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM parked_commands WHERE reason = 'the data is not JSON' AND data = '{not json'::bytea"))
	require.Equal(t, 2, e.outcome(CommandParked))
	require.Len(t, e.replies(t, 1), 1, "an unreadable command has no answer")
}

// TestCommandCommittedButNotAcked: a Users that committed a command's
// answer and died before its ack (here: the ack is never sent) gets the
// command delivered again once the ack wait passes, and the inbox replays
// it: one user, one answer row, one reply.
func TestCommandCommittedButNotAcked(t *testing.T) {
	t.Parallel()
	var dropped atomic.Int32
	e := newBrokerEnv(t, Config{}, func(b *broker) {
		b.commands.afterCommit = func(msg jetstream.Msg) bool {
			meta, err := msg.Metadata()
			if err == nil && meta.NumDelivered == 1 {
				dropped.Add(1)
				return false
			}
			return true
		}
	})
	// A short ack wait, so the redelivery comes within the test.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := e.admin.UpdateConsumer(ctx, natsbus.CommandStream, jetstream.ConsumerConfig{
		Durable: natsbus.UsersConsumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxAckPending: 1000,
	})
	require.NoError(t, err)

	key := uuid.NewString()
	e.publish(t, key, ada)
	require.Eventually(t, func() bool { return e.outcome(OutcomeReplayed) == 1 }, wait, 20*time.Millisecond)
	e.settled(t)
	require.Equal(t, int32(1), dropped.Load())
	r := e.replies(t, 1)[0]
	require.Equal(t, http.StatusCreated, r.Status)
	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, 1, e.count(t, "answers"))
	require.Equal(t, 1, e.outcome(OutcomeCreated))
}

// TestRunServesWhileBrokerIsDown: with USERS_NATS_URL pointing at no
// broker, Users starts, is ready, answers HTTP, and stops cleanly.
func TestRunServesWhileBrokerIsDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	addr, admin := apitest.FreeAddr(t), apitest.FreeAddr(t)
	env := apitest.Env("USERS_DATABASE_URL", e.app.Config().ConnString(), "USERS_HTTP_ADDR", addr, "USERS_ADMIN_ADDR", admin,
		"USERS_API_TOKENS", "outbox-sender:"+senderToken,
		"USERS_NATS_URL", "nats://"+apitest.FreeAddr(t), "USERS_NATS_PASSWORD", "nats-password")
	var logs apitest.Logs
	stop := apitest.RunUntilReady(t, "http://"+admin+"/readyz", func(ctx context.Context) error { return Run(ctx, nil, env, &logs) })
	res := apitest.Do(t, http.MethodPost, "http://"+addr+"/users", ada, "Idempotency-Key", "k-1", "Authorization", "Bearer "+senderToken)
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	require.NoError(t, stop())
}

// TestRunSaysTheBrokerRefusesItsLogin: with a wrong USERS_NATS_PASSWORD,
// Users is not ready and says why (the broker refuses its NATS login, not
// that the broker is down), counts the refusals, and logs an error naming
// its NATS user. A broker that is merely down leaves it ready
// (TestRunServesWhileBrokerIsDown).
func TestRunSaysTheBrokerRefusesItsLogin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	srv := natsserver.ForTest(t)
	addr, admin := apitest.FreeAddr(t), apitest.FreeAddr(t)
	env := apitest.Env("USERS_DATABASE_URL", e.app.Config().ConnString(), "USERS_HTTP_ADDR", addr, "USERS_ADMIN_ADDR", admin,
		"USERS_API_TOKENS", "outbox-sender:"+senderToken,
		"USERS_NATS_URL", srv.URL, "USERS_NATS_PASSWORD", "not-users-password")
	var logs apitest.Logs
	apitest.Start(t, func(ctx context.Context) error { return Run(ctx, nil, env, &logs) })
	// Polled until the listener is up and the broker has refused a login.
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var body string
	require.Eventually(t, func() bool {
		var status int
		status, body = get("/readyz")
		return status == http.StatusServiceUnavailable && strings.Contains(body, `"broker":"down"`)
	}, wait, 20*time.Millisecond, "readiness names the broker")
	require.Contains(t, body, "the broker refuses Users' NATS login (user users): check USERS_NATS_PASSWORD")
	require.Eventually(t, func() bool {
		_, m := get("/metrics")
		return regexp.MustCompile(`(?m)^users_broker_auth_failures_total [1-9]`).MatchString(m)
	}, wait, 20*time.Millisecond, "the refusal counted")
	var line map[string]any
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "the broker refuses this process's NATS login") {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
			break
		}
	}
	require.NotNil(t, line, "an error line says the login is refused: %s", logs.String())
	require.Equal(t, "ERROR", line["level"])
	require.Equal(t, natsbus.UsersUser, line["nats_user"])
}

// TestBrokerConfig: the broker's variables, their defaults, and mistakes
// named by variable, the password never shown.
func TestBrokerConfig(t *testing.T) {
	t.Parallel()
	cfg, _, err := LoadConfig(apitest.Env())
	require.NoError(t, err)
	require.Empty(t, cfg.NATSURL, "no broker by default: HTTP only")
	require.Equal(t, "outbox-sender", cfg.NATSCaller)
	require.Equal(t, 5, cfg.CommandMaxDeliveries)

	_, _, err = LoadConfig(apitest.Env("USERS_NATS_URL", "nats://nats:4222"))
	require.ErrorContains(t, err, "USERS_NATS_PASSWORD (or USERS_NATS_PASSWORD_FILE) is required")
	_, _, err = LoadConfig(apitest.Env("USERS_NATS_URL", "http://u:hunter2@nats:4222", "USERS_NATS_PASSWORD", "x",
		"USERS_NATS_CALLER", "Not A Caller", "USERS_COMMAND_MAX_DELIVERIES", "0"))
	require.ErrorContains(t, err, "USERS_NATS_URL: URL 1 of the list")
	require.ErrorContains(t, err, "USERS_NATS_CALLER")
	require.ErrorContains(t, err, "USERS_COMMAND_MAX_DELIVERIES")
	require.NotContains(t, err.Error(), "hunter2")

	cfg, _, err = LoadConfig(apitest.Env("USERS_NATS_URL", "nats://a:4222,nats://b:4222", "USERS_NATS_PASSWORD", "s3cret-password",
		"USERS_COMMAND_MAX_DELIVERIES", strconv.Itoa(7)))
	require.NoError(t, err)
	require.Equal(t, "nats://a:4222,nats://b:4222", cfg.NATSURL)
	require.Equal(t, 7, cfg.CommandMaxDeliveries)
	require.Equal(t, natsbus.UsersUser, brokerConn(cfg).User)
	require.NotContains(t, fmt.Sprintf("%+v %#v", cfg, cfg), "s3cret-password", "the password is masked")
}

// TestCommandReaderOutlivesReprovisioning: the command consumer deleted
// and provisioned again (an operator re-creating it) does not stop Users
// reading: a command published afterwards is answered.
func TestCommandReaderOutlivesReprovisioning(t *testing.T) {
	t.Parallel()
	e := newBrokerEnv(t, Config{}, nil)
	e.publish(t, uuid.NewString(), ada)
	e.replies(t, 1)
	e.settled(t)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, e.admin.DeleteConsumer(ctx, natsbus.CommandStream, natsbus.UsersConsumer))
	require.NoError(t, natsbus.Provision(ctx, e.admin, natsserver.LocalStreams))
	key := uuid.NewString()
	e.publish(t, key, body("Bob", "bob@example.com", "222-2"))
	r := e.replies(t, 2)[1]
	require.Equal(t, key, r.key, "read through the re-created consumer")
	require.Equal(t, http.StatusCreated, r.Status)
	require.Equal(t, 2, e.count(t, "users"))
}

// TestSlowCommandStaysInProgress: a command whose transaction takes longer
// than the consumer's ack wait (here the users table locked for 4s, ack
// wait 2s) is said to be in progress, and is not delivered again to
// another worker meanwhile: one delivery, one user, nothing replayed.
// Said every 300ms, it may come 1.7s late on a loaded machine before the
// ack wait runs out.
func TestSlowCommandStaysInProgress(t *testing.T) {
	t.Parallel()
	e := newBrokerEnv(t, Config{}, func(b *broker) { b.commands.progressEvery = 300 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := e.admin.UpdateConsumer(ctx, natsbus.CommandStream, jetstream.ConsumerConfig{
		Durable: natsbus.UsersConsumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxAckPending: 1000,
	})
	require.NoError(t, err)

	lock, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(ctx, "LOCK TABLE users IN EXCLUSIVE MODE")
	require.NoError(t, err)
	e.publish(t, uuid.NewString(), ada)
	time.Sleep(4 * time.Second) // two ack waits
	require.NoError(t, lock.Rollback(ctx))

	require.Eventually(t, func() bool { return e.outcome(OutcomeCreated) == 1 }, wait, 20*time.Millisecond)
	e.settled(t)
	require.Zero(t, e.outcome(OutcomeReplayed), "delivered again while the first delivery worked on it")
	require.Zero(t, e.outcome(CommandRetried))
	require.Equal(t, 1, e.count(t, "users"))
}
