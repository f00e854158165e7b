package studentsvc

import "github.com/outboxref/outboxref/internal/outbox"

// Reason is why a student's create-user operation has not succeeded (yet),
// as Student's clients see it: a class to branch on and a fixed sentence to
// show. Neither carries the error itself, which may name internal hosts,
// ports and addresses.
type Reason struct {
	Class   string `json:"class"`
	Message string `json:"message"`
}

// ReasonUnknown is the class shown for a reason class this build of Student
// does not know, so clients only ever see the documented vocabulary.
const ReasonUnknown = "unknown"

// reasonMessages is Student's API vocabulary: each of the outbox's reason
// classes with one sentence a client can show. A test fails when a class
// has no sentence.
var reasonMessages = map[string]string{
	// The sender keeps retrying these.
	outbox.ReasonUsersUnreachable:  "Users unreachable, retrying",
	outbox.ReasonBrokerUnreachable: "message broker unreachable, retrying",
	outbox.ReasonBrokerFull:        "message broker full, retrying",
	outbox.ReasonUsersUnavailable:  "Users unavailable, retrying",
	outbox.ReasonKeyInProgress:     "Users is still processing this request, retrying",
	// Users refused the sender's credentials: a misconfiguration, retried.
	outbox.ReasonUsersAuthRefused:  "Delayed by a configuration problem between the services, retrying",
	outbox.ReasonBrokerAuthRefused: "Delayed by a configuration problem between the services, retrying",
	// A stray answer is retried; a 2xx without a user id is given up on.
	outbox.ReasonUnexpectedAnswer: "Unexpected answer from Users",
	// The sender gave up on these; an operator decides what happens next.
	outbox.ReasonRefused:           "Refused by Users: another user has this document number",
	outbox.ReasonInvalid:           "Refused by Users: the request is invalid",
	outbox.ReasonKeyReused:         "Refused by Users: the operation's key was used for a different request",
	outbox.ReasonExpired:           "Given up: Users did not accept it in time",
	outbox.ReasonAttemptsExhausted: "Given up after too many attempts",
	outbox.ReasonConflict:          "The student is already linked to a different user",
	outbox.ReasonSenderError:       "The request to Users could not be sent",
}

// unknownMessage is the sentence for a class not in reasonMessages.
const unknownMessage = "Provisioning ran into a problem; the operators have the details"

// reasonFor is the public form of the outbox row's reason class: nil when
// there is none, the generic sentence under ReasonUnknown for a class
// Student does not know.
func reasonFor(class string) *Reason {
	if class == "" {
		return nil
	}
	if msg, ok := reasonMessages[class]; ok {
		return &Reason{Class: class, Message: msg}
	}
	return &Reason{Class: ReasonUnknown, Message: unknownMessage}
}
