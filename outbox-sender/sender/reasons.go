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
	ReasonUsersUnreachable, ReasonUsersUnavailable, ReasonKeyInProgress, ReasonUnexpectedAnswer,
	ReasonRefused, ReasonInvalid, ReasonKeyReused, ReasonExpired, ReasonAttemptsExhausted,
	ReasonConflict, ReasonSenderError,
}
