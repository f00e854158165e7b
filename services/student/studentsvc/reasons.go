package studentsvc

import (
	"maps"
	"slices"
)

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

// reasonMessages is Student's API vocabulary: the outbox sender's reason
// classes (outbox-sender/sender/reasons.go), each with one sentence. It is a
// copy, not an import, because Student must not depend on the sender; a
// test in e2e fails when the two lists drift apart.
var reasonMessages = map[string]string{
	// The sender keeps retrying these.
	"users-unreachable": "Users unreachable, retrying",
	"users-unavailable": "Users unavailable, retrying",
	"key-in-progress":   "Users is still processing this request, retrying",
	// Users refused the sender's credentials: a misconfiguration, retried.
	"users-auth-refused": "Delayed by a configuration problem between the services, retrying",
	// A stray answer is retried; a 2xx without a user id is given up on.
	"unexpected-answer": "Unexpected answer from Users",
	// The sender gave up on these; an operator decides what happens next.
	"refused":            "Refused by Users: another user has this document number",
	"invalid-request":    "Refused by Users: the request is invalid",
	"key-reused":         "Refused by Users: the operation's key was used for a different request",
	"expired":            "Given up: Users did not accept it in time",
	"attempts-exhausted": "Given up after too many attempts",
	"conflict":           "The student is already linked to a different user",
	"sender-error":       "The request to Users could not be sent",
}

// unknownMessage is the sentence for a class not in reasonMessages.
const unknownMessage = "Provisioning ran into a problem; the operators have the details"

// ReasonClasses lists the classes Student knows, sorted.
func ReasonClasses() []string {
	return slices.Sorted(maps.Keys(reasonMessages))
}

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
