package studentsvc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/problem"
)

// TestIdempotencyContract is the README's contract table for POST
// /students, row by row, in order, against one database.
func TestIdempotencyContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bob := body("Bob Stone", "bob@example.com", "222-2")
	steps := []struct {
		situation string
		key, body string
		status    int
		replayed  bool
		problem   string
		fields    []string
		students  int // students (and outbox rows) after the step
	}{
		{situation: "malformed key", key: "a b", body: ada, status: 400, problem: problem.TypeValidation, fields: []string{"Idempotency-Key"}},
		{situation: "invalid body", key: "c1", body: `{}`, status: 400, problem: problem.TypeValidation, fields: []string{"name", "email", "document_number"}},
		{situation: "new key", key: "c1", body: ada, status: 201, students: 1},
		{situation: "same key, same body", key: `"c1"`, body: ada, status: 201, replayed: true, students: 1},
		{situation: "same key, different body", key: "c1", body: bob, status: 422, problem: problem.TypeIdempotencyMismatch,
			fields: []string{"document_number", "email", "name"}, students: 1},
		{situation: "no key, document number taken", body: ada, status: 409, problem: problem.TypeDocumentTaken, fields: []string{"document_number"}, students: 1},
		{situation: "new key, document number taken", key: "c2", body: ada, status: 409, problem: problem.TypeDocumentTaken, fields: []string{"document_number"}, students: 1},
		{situation: "replay of the refused key", key: "c2", body: ada, status: 409, replayed: true, problem: problem.TypeDocumentTaken, fields: []string{"document_number"}, students: 1},
		{situation: "no key: each request is new", body: bob, status: 201, students: 2},
	}
	first := map[string][]byte{}
	for _, s := range steps {
		var headers []string
		if s.key != "" {
			headers = []string{"Idempotency-Key", s.key}
		}
		res := e.create(t, s.body, headers...)
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
		require.Equal(t, s.students, e.count(t, "students"), s.situation)
		require.Equal(t, s.students, e.count(t, "outbox"), s.situation)
	}
}
