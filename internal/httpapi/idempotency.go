package httpapi

import (
	"fmt"
	"net/http"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/inbox"
)

// KeyHeader is the request header that carries an idempotency key.
const KeyHeader = "Idempotency-Key"

// ReplayedHeader marks an answer served from the inbox rather than made
// afresh. The first answer for a key never carries it.
const ReplayedHeader = "Idempotent-Replayed"

// IdempotencyKey reads the request's Idempotency-Key. present is false when
// the request has none. A malformed key, or more than one header (rather
// than a guess at which one the client meant), is a 400 naming the header.
func IdempotencyKey(r *http.Request) (key string, present bool, err error) {
	values := r.Header.Values(KeyHeader)
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
		key, err := inbox.ParseKey(values[0])
		if err != nil {
			return "", true, Field(KeyHeader, err.Error())
		}
		return key, true, nil
	}
	return "", true, Field(KeyHeader, fmt.Sprintf("send one Idempotency-Key header, not %d", len(values)))
}

// RequiredKey is IdempotencyKey for an endpoint where the key is required.
func RequiredKey(r *http.Request) (string, error) {
	key, present, err := IdempotencyKey(r)
	if err == nil && !present {
		err = Field(KeyHeader, inbox.ErrNoKey.Error())
	}
	return key, err
}

// Answer is the answer to store under a key for a success: status and the
// JSON encoding of v, with the id of what was created (uuid.Nil for none).
func Answer(status int, v any, created uuid.UUID) (inbox.Outcome, error) {
	body, err := jsonBody(v)
	if err != nil {
		return inbox.Outcome{}, err
	}
	return inbox.Outcome{Status: status, Body: body, ResourceID: created}, nil
}

// Refusal is the answer to store under a key when a business rule says no:
// stored and replayed like a success, because a repeat of the key must get
// the same answer.
func Refusal(p *Problem) inbox.Outcome {
	return inbox.Outcome{Status: p.Status, Body: p.Body()}
}

// WriteOutcome sends an answer made by Answer or Refusal, fresh or from the
// inbox: Idempotent-Replayed when replayed, and Location (locationPrefix +
// id) when it created something.
func WriteOutcome(w http.ResponseWriter, out inbox.Outcome, replayed bool, locationPrefix string) {
	if replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	if out.ResourceID != uuid.Nil {
		w.Header().Set("Location", locationPrefix+out.ResourceID.String())
	}
	// Answer stores successes and Refusal stores problems, and nothing else
	// writes an outcome, so the status says which body a stored answer has.
	ct := "application/json"
	if out.Status >= 400 {
		ct = ProblemContentType
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(out.Status)
	_, _ = w.Write(out.Body)
}
