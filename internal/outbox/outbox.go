// Package outbox names the outbox's things once: the operation a row
// carries, the states a row passes through, the reason classes that say why
// an attempt failed or why a row was given up on, the outcomes a row's
// history records, and the two ways an operator brings a dead row back.
//
// Student writes rows and shows their state and reason to its clients; the
// outbox sender claims, delivers, records and redrives them; the fault lab
// and the invariant checker read them. All four speak these words, and the
// outbox table's CHECK constraints speak them too (a test holds the two
// together). It is a leaf: it imports nothing of the project.
package outbox

import "slices"

// OperationCreateUser asks Users for the user of a new student. It is the
// only operation today; the outbox table's CHECK constraint lists it.
const OperationCreateUser = "create-user"

// The states of an outbox row (the outbox table's state column).
const (
	// StatePending: waiting to be delivered, or being delivered under a
	// sender's lease.
	StatePending = "pending"
	// StatePublished: with the broker transport (SENDER_TRANSPORT=nats),
	// the broker acknowledged the row's command and Users' answer has not
	// come back yet. Due again, under the same key, if it does not come
	// by the row's available_at.
	StatePublished = "published"
	// StateDelivered: Users answered and the answer is recorded on the
	// student.
	StateDelivered = "delivered"
	// StateDead: given up on; the reason class says why, and an operator
	// decides what happens next.
	StateDead = "dead"
)

// States lists every state, in the order a row passes through them.
var States = []string{StatePending, StatePublished, StateDelivered, StateDead}

// Reason classes say, in a word an operator can filter and alert on, why an
// attempt failed or why a row is dead. The full message stays in the row's
// last_error and history.
const (
	// Transient: the row is retried.
	ReasonUsersUnreachable = "users-unreachable" // no answer: refused, reset, timed out
	ReasonUsersUnavailable = "users-unavailable" // Users answered 5xx, 408 or 429
	ReasonKeyInProgress    = "key-in-progress"   // 409: Users is still processing the same key
	ReasonUnexpectedAnswer = "unexpected-answer" // any other answer, such as a stray 404, or a 2xx without a userId (dead)
	// Users (or a proxy before it) refused the sender's credentials: 401
	// or 403. A misconfiguration, never the row's fault: retried, never
	// dead-lettered for it.
	ReasonUsersAuthRefused = "users-auth-refused"
	// The broker did not acknowledge a publish (SENDER_TRANSPORT=nats):
	// unreachable, or no stream took the command.
	ReasonBrokerUnreachable = "broker-unreachable"
	// The broker refused the sender's NATS login (SENDER_NATS_PASSWORD,
	// or a user the broker does not have), as users-auth-refused over
	// HTTP: a misconfiguration, never the row's fault, and nothing was
	// published. Retried, never dead-lettered for it.
	ReasonBrokerAuthRefused = "broker-auth-refused"
	// The broker refused the command because its stream is full (the
	// byte limit provision-broker set, SENDER_NATS_STREAM_MAX_BYTES): Users
	// has not read what it holds. The row waits in the outbox.
	ReasonBrokerFull = "broker-full"

	// Permanent: the row is dead-lettered.
	ReasonRefused           = "refused"            // 409: Users' business rule said no (document number taken)
	ReasonInvalid           = "invalid-request"    // 400: Users found the request invalid
	ReasonKeyReused         = "key-reused"         // 422: the key was first used with a different request
	ReasonExpired           = "expired"            // older than SENDER_MAX_AGE
	ReasonAttemptsExhausted = "attempts-exhausted" // SENDER_MAX_ATTEMPTS used up
	ReasonConflict          = "conflict"           // the student is already linked to a different user
	ReasonSenderError       = "sender-error"       // the sender could not even build the request
)

// ReasonClasses lists every class.
var ReasonClasses = []string{
	ReasonUsersUnreachable, ReasonUsersUnavailable, ReasonKeyInProgress, ReasonUnexpectedAnswer, ReasonUsersAuthRefused,
	ReasonBrokerUnreachable, ReasonBrokerFull, ReasonBrokerAuthRefused,
	ReasonRefused, ReasonInvalid, ReasonKeyReused, ReasonExpired, ReasonAttemptsExhausted,
	ReasonConflict, ReasonSenderError,
}

// RetryClasses are the classes an attempt that is retried may carry: the
// transient ones, and an unexpected answer that might not recur.
var RetryClasses = []string{
	ReasonUsersUnreachable, ReasonUsersUnavailable, ReasonKeyInProgress, ReasonUnexpectedAnswer, ReasonUsersAuthRefused,
	ReasonBrokerUnreachable, ReasonBrokerFull, ReasonBrokerAuthRefused,
}

// DeadClasses are the classes a dead row may carry. A transient failure
// that lasts is dead as expired or attempts-exhausted, never as itself; an
// unexpected answer is dead when it was a 2xx without a user id.
var DeadClasses = []string{
	ReasonRefused, ReasonInvalid, ReasonKeyReused, ReasonExpired, ReasonAttemptsExhausted,
	ReasonConflict, ReasonSenderError, ReasonUnexpectedAnswer,
}

// NewKeySafe lists the reason classes after which a new idempotency key
// cannot create a second user: Users answered, and said no. After any other
// class the old key may have created the user, its answer lost.
var NewKeySafe = []string{ReasonRefused, ReasonInvalid, ReasonKeyReused}

// IsNewKeySafe says whether a row dead for this class may be redriven with
// a new key without risking a second user.
func IsNewKeySafe(class string) bool {
	return slices.Contains(NewKeySafe, class)
}

// The outcomes of an attempt, as a row's history records them and the
// sender's results metric labels them.
const (
	OutcomeDelivered = "delivered" // Users gave a user id: the student is linked
	OutcomeRetry     = "retry"     // a transient failure: tried again after a backoff
	OutcomeDead      = "dead"      // a permanent failure: the row is dead-lettered
	OutcomeReleased  = "released"  // not sent (the sender was stopping): handed back
	// OutcomePublished: the broker took the command (SENDER_TRANSPORT=nats);
	// the row waits for Users' answer on the reply stream.
	OutcomePublished = "published"
	// OutcomeUnread: not published again, because the broker still holds
	// the row's last command and Users has not read it; the row waits
	// again, and the claim does not count as an attempt. Not in a row's
	// history: nothing was sent.
	OutcomeUnread = "unread"
)

// The ways an operator redrives a dead row, as a redrive's history entry
// records them.
const (
	// RedriveRetry keeps the idempotency key. Right when the cause was
	// transient (Users was down past SENDER_MAX_AGE): Users replays the
	// answer it stored for the key, or creates the user once.
	RedriveRetry = "retry"
	// RedriveNewOperation mints a new key and keeps the old one in
	// previous_keys. Right when the cause of Users' refusal was fixed: the
	// old key's stored refusal would otherwise be replayed for ever.
	RedriveNewOperation = "new-operation"
)
