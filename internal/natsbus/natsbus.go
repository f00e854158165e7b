// Package natsbus holds the broker's words, for the processes that speak
// through NATS JetStream when SENDER_TRANSPORT=nats: the streams, subjects
// and durable consumers, the headers and bodies of the two messages (a
// create-user command and its reply), what each process may do on the
// broker, and the provisioning that creates the streams and consumers.
//
// The broker carries the same operation as the HTTP hop, with the same
// key discipline: a command carries the outbox row's idempotency key as
// Idempotency-Key (Users' inbox, which remembers the key for
// USERS_INBOX_RETENTION, decides), and a message id of its publish as
// Nats-Msg-Id (JetStream drops a copy within its de-duplication window).
// The window is a first filter only: it is finite, and a consumer can
// fail after its commit and before its ack, and so get the same message
// again long after any window.
package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxref/outboxref/internal/auth"
)

// The streams, their subjects, and the durable consumers reading them.
const (
	// CommandStream holds the sender's create-user commands for Users.
	CommandStream = "USERS_COMMANDS"
	// CreateUserSubject is a create-user command's subject.
	CreateUserSubject = "users.commands.create-user"
	// ReplyStream holds Users' answers, relayed from Users' own outbox.
	ReplyStream = "USERS_REPLIES"
	// CreateUserReplySubject is the subject of an answer to a create-user
	// command.
	CreateUserReplySubject = "users.replies.create-user"

	// UsersConsumer is Users' durable pull consumer on CommandStream:
	// every Users process shares it, and so shares the work.
	UsersConsumer = "users"
	// SenderConsumer is the sender's durable pull consumer on ReplyStream.
	SenderConsumer = "outbox-sender"
)

// The NATS users, one per process, each allowed only its own subjects
// (Permissions).
const (
	SenderUser = "outbox-sender"
	UsersUser  = "users"
)

// Headers of both messages, beside JetStream's Nats-Msg-Id.
const (
	// HeaderKey is the operation's idempotency key: on a command, the
	// outbox row's key; on a reply, the key of the command it answers.
	HeaderKey = "Idempotency-Key"
	// HeaderAttempt is the sender's attempt number, for log lines.
	HeaderAttempt = "Outbox-Attempt"
	// HeaderExpires is when the command's outbox row expires (RFC 3339,
	// by Student's database's clock): the sender dead-letters the row
	// then, and Users does not act on the command after it.
	HeaderExpires = "Outbox-Expires"
)

// Reply is the body of an answer on ReplyStream: the answer Users stored
// under the command's key, as the HTTP hop would have sent it (a status
// and its body: the created user, or a problem).
type Reply struct {
	IdempotencyKey uuid.UUID       `json:"idempotencyKey"`
	Status         int             `json:"status"`
	Body           json.RawMessage `json:"body"`
}

// DecodeReply reads a reply, refusing one without a key or a status.
func DecodeReply(data []byte) (Reply, error) {
	var r Reply
	if err := json.Unmarshal(data, &r); err != nil {
		return Reply{}, fmt.Errorf("decode reply: %w", err)
	}
	if r.IdempotencyKey == uuid.Nil || r.Status < 100 || r.Status > 599 {
		return Reply{}, errors.New("decode reply: no idempotencyKey or no valid status")
	}
	return r, nil
}

// Permissions are the subjects a NATS user may publish to and subscribe
// to. Both lists name the JetStream API calls each process makes, by
// stream and consumer, so that a process can read only its own consumer
// and ack only its own messages. Creating streams and consumers is the
// provisioner's (Provision), never a running process's.
type Permissions struct {
	Publish, Subscribe []string
}

// PermissionsOf returns the permissions of the NATS user of a process
// (SenderUser, UsersUser).
func PermissionsOf(user string) (Permissions, bool) {
	var p Permissions
	switch user {
	case SenderUser:
		p.Publish = append(consumerCalls(ReplyStream, SenderConsumer), CreateUserSubject,
			// How far Users has read the commands (its consumer's ack
			// floor, the stream's newest sequence): a row is published
			// again only past it. A look, not a read: the sender cannot
			// fetch or ack Users' messages.
			"$JS.API.CONSUMER.INFO."+CommandStream+"."+UsersConsumer, "$JS.API.STREAM.INFO."+CommandStream)
	case UsersUser:
		p.Publish = append(consumerCalls(CommandStream, UsersConsumer), CreateUserReplySubject)
	default:
		return Permissions{}, false
	}
	p.Subscribe = []string{InboxPrefix(user) + ".>"}
	return p, true
}

// consumerCalls are the JetStream API subjects a process needs to read one
// durable pull consumer and acknowledge what it reads.
func consumerCalls(stream, consumer string) []string {
	return []string{
		"$JS.API.CONSUMER.INFO." + stream + "." + consumer,
		"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer,
		"$JS.ACK." + stream + "." + consumer + ".>",
	}
}

// InboxPrefix is the prefix of a user's reply subjects (publish
// acknowledgements, fetched messages): its own, so that no process can
// subscribe to another's.
func InboxPrefix(user string) string { return "_INBOX_" + user }

// Config is how a process reaches the broker.
type Config struct {
	URL      string      // comma-separated server URLs
	User     string      // the process's NATS user
	Password auth.Secret // its password
	Name     string      // the connection's name, seen in the server's monitoring
	// OnLoginRefused, when set, is called each time the broker refuses
	// the login: a process's counter of them.
	OnLoginRefused func()
}

// Redacted is a server list with any password in it masked.
func Redacted(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			if scheme := strings.Index(p, "://"); scheme >= 0 && scheme < at {
				parts[i] = p[:scheme+3] + "[redacted]" + p[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// Streams are how Provision makes the two streams.
type Streams struct {
	// Replicas is how many servers hold each message (1, or 3 in a
	// three-node cluster, which then survives the loss of one).
	Replicas int
	// Duplicates is JetStream's de-duplication window.
	Duplicates time.Duration
	// MaxAge is how long an unread command stays in the command stream.
	// Users ignores a command read after its row's expiry anyway; an
	// answer, on the other hand, waits in the reply stream until the
	// sender has read it, however long that takes.
	MaxAge time.Duration
	// MaxBytes bounds each stream's storage. A full stream refuses new
	// messages and keeps what it holds (discard new): a refused command
	// waits in Student's outbox (reason class broker-full), a refused
	// answer in Users' outbox, until readers make room.
	MaxBytes int64
}

// DefaultStreams are the streams' settings unless the provisioner says
// otherwise.
var DefaultStreams = Streams{Replicas: 1, Duplicates: 2 * time.Minute, MaxAge: 7 * 24 * time.Hour, MaxBytes: 1 << 30}

// AckWait is how long the server waits for a consumer's ack before it
// delivers the message again: how soon a message whose reader died is
// read by another. A reader that works on a message for longer (Users'
// transaction may take up to USERS_DATABASE_TIMEOUT) says it is in
// progress every third of it (KeepInProgress).
const AckWait = 10 * time.Second

// PullExpiry is how long each pull request a consumer's reader sends
// lasts before the client sends another. The client expects the server's
// heartbeats every half of it; two missed and it pulls again. When the
// node leading a consumer dies, its pull requests die with it and nothing
// says so: the reader learns it only from the missing heartbeats. With the
// client's default (30s) that was 30 seconds without a command read after
// every such loss, a new leader long up; with 4s, a reader pulls from the
// new leader within 4 seconds of losing the old. A pull every 4 seconds
// per idle reader costs the broker nothing worth counting.
const PullExpiry = 4 * time.Second

// PullOptions are how both readers (Users' commands, the sender's replies)
// pull: at most limit messages in hand, and PullExpiry.
func PullOptions(limit int) []jetstream.PullConsumeOpt {
	return []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(limit), jetstream.PullExpiry(PullExpiry)}
}

// KeepInProgress tells the broker every so often that msgs are still
// being handled, which starts their ack waits again, until stop is called.
// Nothing is sent for messages handled within every, the usual case.
func KeepInProgress(every time.Duration, msgs ...jetstream.Msg) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		for _, msg := range msgs {
			_ = msg.InProgress() // lost: the message may come again, and is handled as a repeat
		}
		t.Reset(every)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// Provision creates (or updates) both streams and both durable consumers.
// It needs rights no service process has: run it as the broker's admin,
// once per deployment and again after any change here.
func Provision(ctx context.Context, js jetstream.JetStream, s Streams) error {
	for _, st := range []jetstream.StreamConfig{
		{Name: CommandStream, Subjects: []string{"users.commands.>"}, MaxAge: s.MaxAge},
		{Name: ReplyStream, Subjects: []string{"users.replies.>"}},
	} {
		// Interest retention: a message stays until every durable
		// consumer of its stream has acknowledged it, and then goes. So a
		// stream holds what is unread (a backlog, not a week of traffic),
		// and its byte limit is a bound on the backlog. Another reader (an
		// audit, a second service) is another durable consumer, and gets
		// every message from its creation on. A stream with no consumer
		// keeps nothing: provision them together, as below.
		st.Retention = jetstream.InterestPolicy
		st.Discard = jetstream.DiscardNew
		st.MaxBytes = s.MaxBytes
		st.Storage = jetstream.FileStorage
		st.Replicas = s.Replicas
		st.Duplicates = s.Duplicates
		if _, err := js.CreateOrUpdateStream(ctx, st); err != nil {
			return fmt.Errorf("provision stream %s: %w", st.Name, err)
		}
	}
	for _, c := range []struct{ stream, name string }{
		{CommandStream, UsersConsumer},
		{ReplyStream, SenderConsumer},
	} {
		_, err := js.CreateOrUpdateConsumer(ctx, c.stream, jetstream.ConsumerConfig{
			Durable:   c.name,
			AckPolicy: jetstream.AckExplicitPolicy,
			AckWait:   AckWait,
			// No MaxDeliver: the server would drop a message past it with
			// an advisory only. A consumer parks what it cannot handle
			// itself, where an operator sees it.
			MaxAckPending: 1000,
			Replicas:      s.Replicas,
		})
		if err != nil {
			return fmt.Errorf("provision consumer %s on %s: %w", c.name, c.stream, err)
		}
	}
	return nil
}

// Parked is a message its consumer could not read, as it is kept for an
// operator (Users' parked_commands, the sender's parked_replies) before
// it is terminated on the broker.
type Parked struct {
	Stream   string
	Sequence uint64 // in its stream
	Subject  string
	Headers  []byte // JSON, its values cut at ParkedHeaderValue
	// Data is the message's first ParkedKeep bytes; Size its whole size.
	Data       []byte
	Size       int
	Reason     string
	Deliveries int
}

// What a parked message keeps: enough to see what it was and why it could
// not be read, not the broker's megabyte per message, which a stream of
// unreadable messages would otherwise pile up in a database.
const (
	ParkedKeep        = 4 << 10 // bytes of the data
	ParkedHeaderValue = 256     // bytes of each header value
	parkedHeaders     = 4 << 10 // bytes of all the headers, as JSON
)

// ParkedOf describes msg, delivered as meta says, for parking.
func ParkedOf(msg jetstream.Msg, meta *jetstream.MsgMetadata, reason string) Parked {
	data := msg.Data()
	return Parked{
		Stream: meta.Stream, Sequence: meta.Sequence.Stream, Subject: msg.Subject(), Headers: keptHeaders(msg.Headers()),
		Data: data[:min(len(data), ParkedKeep)], Size: len(data), Reason: reason, Deliveries: int(min(meta.NumDelivered, 1<<31-1)),
	}
}

// keptHeaders is h as JSON, each value cut at ParkedHeaderValue bytes:
// the headers this package writes first, then the others in name order,
// until the next would take the whole past parkedHeaders.
func keptHeaders(h nats.Header) []byte {
	ours := []string{HeaderKey, jetstream.MsgIDHeader, HeaderAttempt, HeaderExpires, "Traceparent"}
	names := slices.DeleteFunc(slices.Sorted(maps.Keys(h)), func(n string) bool { return slices.Contains(ours, n) })
	for _, n := range slices.Backward(ours) {
		if _, ok := h[n]; ok {
			names = slices.Insert(names, 0, n)
		}
	}
	kept := map[string][]string{}
	size := 2
	for _, name := range names {
		var values []string
		for _, v := range h[name] {
			if len(v) > ParkedHeaderValue {
				v = strings.ToValidUTF8(v[:ParkedHeaderValue], "") + "…"
			}
			values = append(values, v)
		}
		b, err := json.Marshal(map[string][]string{name: values})
		if err != nil {
			continue
		}
		if size+len(b) > parkedHeaders {
			break
		}
		kept[name], size = values, size+len(b)
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return []byte("{}")
	}
	return b
}

// HTTPHeader is h as an http.Header, for the trace propagator (both are
// maps of canonical names to values).
func HTTPHeader(h nats.Header) http.Header { return http.Header(h) }

// WaitConsumer looks up a durable consumer, each try bounded by timeout,
// until it is found or ctx ends (ctx's error). While the broker is
// unreachable or the consumer not yet provisioned, it waits up to 5s
// between tries and tells failed about each failure (a process pacing its
// log lines).
func WaitConsumer(ctx context.Context, js jetstream.JetStream, stream, consumer string, timeout time.Duration, failed func(error)) (jetstream.Consumer, error) {
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		tctx, cancel := context.WithTimeout(ctx, timeout)
		cons, err := js.Consumer(tctx, stream, consumer)
		cancel()
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		failed(err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}
