package sender

import "github.com/outboxref/outboxref/internal/outbox"

// The reason classes, as the outbox package names them.
const (
	ReasonUsersUnreachable  = outbox.ReasonUsersUnreachable
	ReasonUsersUnavailable  = outbox.ReasonUsersUnavailable
	ReasonKeyInProgress     = outbox.ReasonKeyInProgress
	ReasonUnexpectedAnswer  = outbox.ReasonUnexpectedAnswer
	ReasonUsersAuthRefused  = outbox.ReasonUsersAuthRefused
	ReasonRefused           = outbox.ReasonRefused
	ReasonInvalid           = outbox.ReasonInvalid
	ReasonKeyReused         = outbox.ReasonKeyReused
	ReasonExpired           = outbox.ReasonExpired
	ReasonAttemptsExhausted = outbox.ReasonAttemptsExhausted
	ReasonConflict          = outbox.ReasonConflict
	ReasonSenderError       = outbox.ReasonSenderError
)

// ReasonClasses lists every class, for validating filters.
var ReasonClasses = outbox.ReasonClasses
