package relay

import (
	"context"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// A Source is where new rows come from. The engine runs one claim loop for
// each of its feeds, runs the source's own work beside them, and tells it
// which rows are settled. It never asks which source it has.
type Source interface {
	// Feeds are the places to claim rows from: the table for every
	// source (retries, expired leases and redrives come due there), and a
	// stream's announced rows for change data capture.
	Feeds() []Feed
	// Run does the source's background work (listening for
	// notifications, reading a replication slot) until ctx ends. The
	// engine ends ctx after its last answer is recorded.
	Run(ctx context.Context)
	// Settled is told the ids of rows whose results are recorded (or
	// left to their leases after recording failed for good). Rows handed
	// back unsent are not settled.
	Settled(ids []int64)
}

// A Feed is one place the claim loop takes rows from.
type Feed interface {
	// Wait blocks until rows may be waiting and says how many at most
	// (Unknown when the feed cannot tell, as the table cannot). It
	// returns 0 once ctx has ended. last is how the previous claim went
	// (the zero Claimed before the first).
	Wait(ctx context.Context, last Claimed) int
	// Claim claims up to n rows. ctx is not cancelled by shutdown: a
	// claim cut short may still have committed.
	Claim(ctx context.Context, n int) ([]store.Row, error)
	// String names the feed in log lines.
	String() string
}

// Unknown is what Feed.Wait says when it cannot tell how many rows wait.
const Unknown = math.MaxInt

// Claimed is how a claim went.
type Claimed struct {
	Asked, Got int
	Err        error
}

// Full says the claim took all it asked for: more rows are probably due.
func (c Claimed) Full() bool { return c.Err == nil && c.Asked > 0 && c.Got == c.Asked }

// How long a claim waits for company, so that one claim (one transaction)
// serves many rows. Feeds use them too.
const (
	// WakeLinger is how long a claim waits after rows were announced, so
	// that the commits right behind the first share its claim. It adds to
	// the latency of every row it waits for, so it is short: 10ms put p50
	// at 200 students/s at 23 ms, 2ms at 11 ms (make bench).
	WakeLinger = 2 * time.Millisecond
	// WakeQuiet is how far a notification must follow the one before for
	// the stream to count as quiet: nothing is likely right behind its
	// commit, so the claim goes at once instead of lingering. At 200
	// students/s, sent evenly, notifications come 5 ms apart, each the
	// only row its claim would get; lingering for company cost each of
	// them WakeLinger and the sender an idle gap and a wake-up. Twice
	// WakeLinger, so that a stream whose notifications come a little
	// slower than the linger still shares claims.
	WakeQuiet = 2 * WakeLinger
	// BusyLinger is how long a busy claim waits for a batch's worth of
	// rows or capacity before it claims with what it has. Under a backlog,
	// slots free one by one as deliveries finish; claiming at every free
	// slot would cost a claim query per row or two. A few milliseconds
	// gather dozens.
	BusyLinger = 10 * time.Millisecond
)

// A Transport carries one row's operation to Users and says what came of
// it. It bounds each delivery itself, also when ctx ends: an answer Users
// already committed is better recorded now than found again later.
type Transport interface {
	Deliver(ctx context.Context, row store.Row) Answer
}

// Answer is what a transport made of one delivery.
type Answer struct {
	Verdict Verdict
	UserID  uuid.UUID // the user Users answered with (Delivered)
	// Class says why it failed (Transient, Permanent): one of
	// outbox.ReasonClasses.
	Class string
	Error string
	// RetryAfter is the least wait the other side asked for before the
	// next attempt; the engine caps it at SENDER_BACKOFF_MAX.
	RetryAfter time.Duration
	// Status is the other side's status code, for the log line; 0 when
	// there was no answer.
	Status int
	// Seq is where the broker put the command (Published): its sequence
	// in the command stream.
	Seq uint64
	// Repeat (Published): the broker already held this very publish (a
	// copy of one whose recording was lost), and dropped it: not counted
	// as an attempt.
	Repeat bool
	// Unsent (Transient): the transport knows nothing left for Users (no
	// connection to send on, a refused login, a broker that refused to
	// take the command). The claim does not count as an attempt.
	Unsent bool
}

// Verdict is a transport's judgement of an answer.
type Verdict int

const (
	// Delivered: Users gave a user id.
	Delivered Verdict = iota
	// Transient: the same request may succeed later; it is retried.
	Transient
	// Permanent: the same request will fail again; the row is dead-lettered.
	Permanent
	// Published: a broker took the command; Users' answer comes later, on
	// the reply stream, and the engine records it then (RecordReplies).
	// RetryAfter is how long the row waits for it before it is published
	// again.
	Published
	// Unread: the broker still holds the command published for the row
	// before, and Users has not read it yet; nothing was published. The
	// row waits for the answer again, at least RetryAfter, and the claim
	// does not count as an attempt.
	Unread
)

// The outcomes the engine records, shorter to read in its code.
const (
	delivered = outbox.OutcomeDelivered
	retry     = outbox.OutcomeRetry
	dead      = outbox.OutcomeDead
	released  = outbox.OutcomeReleased
	published = outbox.OutcomePublished
	unread    = outbox.OutcomeUnread
)
