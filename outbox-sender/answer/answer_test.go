package answer

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// Users' answers, and what the sender makes of each, are tested with the
// whole relay in package sender, over both transports; this is what the
// transports tell Judge apart from the status and the body: whether the
// body is a problem document.
func TestJudgeReadsOnlyAProblemAsOne(t *testing.T) {
	t.Parallel()
	taken := []byte(`{"type":"` + httpapi.TypeDocumentTaken + `","title":"Document number taken","status":409}`)
	a := Judge(409, true, taken)
	require.Equal(t, relay.Answer{Verdict: relay.Permanent, Class: outbox.ReasonRefused, Error: "Users answered 409 Document number taken"}, a)

	// The same body, not said to be a problem document (a proxy's JSON),
	// says nothing of Users' rules: retried.
	a = Judge(409, false, taken)
	require.Equal(t, relay.Answer{Verdict: relay.Transient, Class: outbox.ReasonUnexpectedAnswer, Error: "Users answered 409 Conflict"}, a)

	user := uuid.New()
	require.Equal(t, relay.Answer{Verdict: relay.Delivered, UserID: user}, Judge(201, false, []byte(`{"userId":"`+user.String()+`"}`)))
	require.Equal(t, relay.Permanent, Judge(201, false, []byte(`{}`)).Verdict, "a 2xx without a user id")
	require.Equal(t, outbox.ReasonUsersUnavailable, Judge(503, false, []byte("<html>")).Class)
}
