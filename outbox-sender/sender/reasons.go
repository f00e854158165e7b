package sender

// Reason classes say, in a word an operator can filter and alert on, why an
// attempt failed or why a row is dead. The full message stays in
// last_error and the row's history.
const (
	// Transient: the row is retried.
	ReasonUsersUnreachable = "users-unreachable" // no answer: refused, reset, timed out
	ReasonUsersUnavailable = "users-unavailable" // Users answered 5xx, 408 or 429
	ReasonKeyInProgress    = "key-in-progress"   // 409: Users is still processing the same key
	ReasonUnexpectedAnswer = "unexpected-answer" // any other answer, such as a stray 404, or a 2xx without a userId (dead)
	// Users (or a proxy before it) refused the sender's credentials: 401
	// or 403. A misconfiguration (SENDER_USERS_TOKEN missing, wrong, or
	// not in USERS_API_TOKENS), never the row's fault: retried, never
	// dead-lettered for it, and counted apart (outbox_sender_auth_failures_total).
	ReasonUsersAuthRefused = "users-auth-refused"

	// Permanent: the row is dead-lettered.
	ReasonRefused           = "refused"            // 409: Users' business rule said no (document number taken)
	ReasonInvalid           = "invalid-request"    // 400: Users found the request invalid
	ReasonKeyReused         = "key-reused"         // 422: the key was first used with a different request
	ReasonExpired           = "expired"            // older than SENDER_MAX_AGE
	ReasonAttemptsExhausted = "attempts-exhausted" // SENDER_MAX_ATTEMPTS used up
	ReasonConflict          = "conflict"           // the student is already linked to a different user
	ReasonSenderError       = "sender-error"       // the sender could not even build the request
)

// ReasonClasses lists every class, for validating filters.
var ReasonClasses = []string{
	ReasonUsersUnreachable, ReasonUsersUnavailable, ReasonKeyInProgress, ReasonUnexpectedAnswer, ReasonUsersAuthRefused,
	ReasonRefused, ReasonInvalid, ReasonKeyReused, ReasonExpired, ReasonAttemptsExhausted,
	ReasonConflict, ReasonSenderError,
}
