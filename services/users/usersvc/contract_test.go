package usersvc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/problem"
)

// TestIdempotencyContract is the README's contract table for POST /users,
// row by row, in order, against one database. Each row states what the
// client sends and everything it must get back.
func TestIdempotencyContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	bob := body("Bob Stone", "bob@example.com", "222-2")
	steps := []struct {
		situation string
		key, body string
		status    int
		replayed  bool
		problem   string
		fields    []string
		users     int // users in the database after the step
	}{
		{situation: "no key", body: ada, status: 400, problem: problem.TypeValidation, fields: []string{"Idempotency-Key"}},
		{situation: "malformed key", key: "a,b", body: ada, status: 400, problem: problem.TypeValidation, fields: []string{"Idempotency-Key"}},
		{situation: "invalid body", key: "k1", body: `{"name":"Ada"}`, status: 400, problem: problem.TypeValidation, fields: []string{"email", "document_number"}},
		{situation: "new key (bare)", key: "k1", body: ada, status: 201, users: 1},
		{situation: "same key, same body (quoted)", key: `"k1"`, body: ada, status: 201, replayed: true, users: 1},
		{situation: "same key, different body", key: "k1", body: body("Ada Lovelace", "ada@example.org", "111-1"), status: 422,
			problem: problem.TypeIdempotencyMismatch, fields: []string{"email"}, users: 1},
		{situation: "new key, document number taken", key: "k2", body: body("Ada L.", "ada2@example.com", "111-1"), status: 409,
			problem: problem.TypeDocumentTaken, fields: []string{"document_number"}, users: 1},
		{situation: "replay of the refused key", key: "k2", body: body("Ada L.", "ada2@example.com", "111-1"), status: 409, replayed: true,
			problem: problem.TypeDocumentTaken, fields: []string{"document_number"}, users: 1},
		{situation: "new key, new person", key: "k3", body: bob, status: 201, users: 2},
	}
	first := map[string][]byte{}
	for _, s := range steps {
		res := e.create(t, s.key, s.body)
		require.Equal(t, s.status, res.Status, "%s: %s", s.situation, res.Body)
		require.Equal(t, s.replayed, res.Header.Get(inbox.ReplayedHeader) == "true", s.situation)
		if s.problem != "" {
			p := res.Problem(t)
			require.Equal(t, s.problem, p.Type, s.situation)
			require.Equal(t, s.fields, p.Fields(), s.situation)
		}
		if s.key != "" && s.status != 400 && s.status != 422 {
			key, err := inbox.ParseKey(s.key)
			require.NoError(t, err)
			if s.replayed {
				require.Equal(t, string(first[key]), string(res.Body), "%s: a replay returns the stored body", s.situation)
			} else {
				first[key] = res.Body
			}
		}
		require.Equal(t, s.users, e.count(t, "users"), s.situation)
	}
}
