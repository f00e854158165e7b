// Package answer says what Users' answer to a create-user operation
// means, for either transport: the HTTP transport judges the answer to its
// POST /users, the broker transport the answer Users stored and relayed on
// the reply stream. Both carry the same status and body, so one judgement
// serves both, and neither transport imports the other.
package answer

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// Judge classifies an answer of Users' to a create-user operation: its
// status, whether its body is a problem document (problem+json), and the
// body. Only an answer that cannot change on a retry is permanent: a 2xx
// (with a user id, or a broken one without), or one of Users' own problem
// types about the request itself. Everything else is retried: 5xx, 408,
// 429, a key still in progress, and also any other 4xx, which more likely
// comes from a misrouted URL or a proxy mid-deploy than from Users, and
// must not dead-letter the whole outbox. A body that is not a problem
// document is never read as one.
func Judge(code int, problem bool, body []byte) relay.Answer {
	if code >= 200 && code < 300 {
		var created struct {
			UserID uuid.UUID `json:"userId"`
		}
		if err := json.Unmarshal(body, &created); err != nil || created.UserID == uuid.Nil {
			return relay.Answer{Verdict: relay.Permanent, Class: outbox.ReasonUnexpectedAnswer, Error: fmt.Sprintf("Users answered %d without a userId", code)}
		}
		return relay.Answer{Verdict: relay.Delivered, UserID: created.UserID}
	}
	var p httpapi.Problem
	if problem {
		_ = json.Unmarshal(body, &p)
	}
	why := fmt.Sprintf("Users answered %d %s", code, http.StatusText(code))
	if p.Title != "" {
		why = fmt.Sprintf("Users answered %d %s", code, p.Title)
	}
	permanent := func(class string) relay.Answer {
		return relay.Answer{Verdict: relay.Permanent, Class: class, Error: why}
	}
	switch {
	case code == http.StatusBadRequest && p.Type == httpapi.TypeValidation:
		return permanent(outbox.ReasonInvalid)
	case code == http.StatusConflict && p.Type == httpapi.TypeDocumentTaken:
		return permanent(outbox.ReasonRefused)
	case code == http.StatusUnprocessableEntity && p.Type == httpapi.TypeIdempotencyMismatch:
		return permanent(outbox.ReasonKeyReused)
	}
	a := relay.Answer{Verdict: relay.Transient, Class: outbox.ReasonUnexpectedAnswer, Error: why}
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		a.Class = outbox.ReasonUsersAuthRefused
	case code == http.StatusConflict && p.Type == httpapi.TypeIdempotencyBusy:
		a.Class = outbox.ReasonKeyInProgress
	case code >= 500, code == http.StatusRequestTimeout, code == http.StatusTooManyRequests:
		a.Class = outbox.ReasonUsersUnavailable
	}
	return a
}
