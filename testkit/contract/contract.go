// Package contract is the idempotency contract of the table in docs/contract.md, as a
// test suite that runs against any endpoint implementing it. Student's
// POST /students and Users' POST /users both run it, so the one contract is
// checked once, the same way, in both places.
package contract

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
)

// Target is an endpoint under the contract.
type Target struct {
	URL string // where to POST, such as base + "/users"
	// KeyRequired: a request without Idempotency-Key is refused (Users),
	// rather than run as a new operation each time (Student).
	KeyRequired bool
	// Created counts what the endpoint has created so far; it should also
	// check that everything created with it (an outbox row) is there.
	Created func(t *testing.T) int
	// DB is the service's database, where the suite holds a key in an open
	// transaction, as a concurrent request would. The service must be
	// configured with a short idempotency wait (a second or less).
	DB *pgxpool.Pool
	// Token is a caller's bearer token: every request sends it, and the
	// suite adds the rows of requests without it or with a wrong one.
	// Caller is the name the target knows that caller by, whose scope the
	// suite's keys live in.
	Token, Caller string
	// OtherToken, when set, is a second caller's token: the suite checks
	// that its keys are its own.
	OtherToken string
}

// Body is a person's JSON body.
func Body(name, email, doc string) string {
	return fmt.Sprintf(`{"name":%q,"email":%q,"document_number":%q}`, name, email, doc)
}

type step struct {
	situation string
	keys      []string // Idempotency-Key headers sent, in order
	body      string
	status    int
	replayed  bool
	problem   string
	fields    []string
	created   int // what exists after the step
	sameAs    string
	// contentType replaces application/json when set.
	contentType string
	// authz replaces the target's Authorization header when set; noAuthz
	// sends none.
	authz string
}

const noAuthz = "none"

// Run walks the contract row by row, in order, against one fresh database:
// each step states what the client sends and everything it must get back.
func Run(t *testing.T, tg Target) {
	t.Helper()
	ada := Body("Ada Lovelace", "ada@example.com", "111-1")
	adaOtherEmail := Body("Ada Lovelace", "ada@example.org", "111-1")
	adaOtherKey := Body("Ada L.", "ada2@example.com", "111-1")
	bob := Body("Bob Stone", "bob@example.com", "222-2")
	key := func(k string) []string { return []string{k} }
	validation, mismatch, taken := httpapi.TypeValidation, httpapi.TypeIdempotencyMismatch, httpapi.TypeDocumentTaken
	keyField := []string{httpapi.KeyHeader}

	var steps []step
	if tg.Token != "" {
		// Refused before anything is read: nothing written, and the key,
		// k1, is still free for the valid request below.
		unauthorized := httpapi.TypeUnauthorized
		steps = append(steps,
			step{situation: "no credentials", authz: noAuthz, keys: key("k1"), body: ada, status: 401, problem: unauthorized},
			step{situation: "wrong token", authz: "Bearer wrong-token-0123456789abcdef", keys: key("k1"), body: ada, status: 401, problem: unauthorized},
			step{situation: "malformed Authorization", authz: "Basic " + tg.Token, keys: key("k1"), body: ada, status: 401, problem: unauthorized},
		)
	}
	steps = append(steps, []step{
		{situation: "malformed key", keys: key("a,b"), body: ada, status: 400, problem: validation, fields: keyField},
		{situation: "key longer than 255", keys: key(strings.Repeat("k", 256)), body: ada, status: 400, problem: validation, fields: keyField},
		{situation: "key sent twice", keys: []string{"k1", "k2"}, body: ada, status: 400, problem: validation, fields: keyField},
		{situation: "invalid body", keys: key("k1"), body: `{"name":"Ada"}`, status: 400, problem: validation, fields: []string{"email", "document_number"}},
		{situation: "body over 16 KiB", keys: key("k1"), body: Body(strings.Repeat("a", 17<<10), "a@b.co", "111-1"), status: 400, problem: validation, fields: []string{"body"}},
		{situation: "not JSON", keys: key("k1"), body: ada, contentType: "text/plain", status: 415, problem: httpapi.TypeUnsupportedMediaType},
		{situation: "new key (bare)", keys: key("k1"), body: ada, status: 201, created: 1},
		{situation: "same key (quoted), same body", keys: key(`"k1"`), body: ada, status: 201, replayed: true, created: 1, sameAs: "k1"},
		{situation: "same key, different body", keys: key("k1"), body: adaOtherEmail, status: 422, problem: mismatch, fields: []string{"email"}, created: 1},
		{situation: "new key, document number taken", keys: key("k2"), body: adaOtherKey, status: 409, problem: taken, fields: []string{"document_number"}, created: 1},
		{situation: "replay of the refused key", keys: key("k2"), body: adaOtherKey, status: 409, replayed: true, problem: taken, fields: []string{"document_number"}, created: 1, sameAs: "k2"},
		{situation: "new key, new person", keys: key("k3"), body: bob, status: 201, created: 2},
	}...)
	if tg.KeyRequired {
		steps = append(steps, step{situation: "no key", body: Body("Cy", "cy@example.com", "333-3"), status: 400, problem: validation, fields: keyField, created: 2})
	} else {
		steps = append(steps,
			step{situation: "no key, document number taken", body: ada, status: 409, problem: taken, fields: []string{"document_number"}, created: 2},
			step{situation: "no key: each request is new", body: Body("Cy", "cy@example.com", "333-3"), status: 201, created: 3},
		)
	}
	if tg.OtherToken != "" {
		// Another caller's k1 is another operation: created, neither a
		// replay of the first caller's k1 nor a 422 that would name the
		// fields in which the first caller's request differs.
		other, dee := "Bearer "+tg.OtherToken, Body("Dee", "dee@example.com", "444-4")
		n := steps[len(steps)-1].created
		steps = append(steps,
			step{situation: "same key from another caller", authz: other, keys: key("k1"), body: dee, status: 201, created: n + 1},
			step{situation: "its replay", authz: other, keys: key("k1"), body: dee, status: 201, replayed: true, created: n + 1, sameAs: "other:k1"},
			step{situation: "the first caller's k1 is untouched", keys: key("k1"), body: ada, status: 201, replayed: true, created: n + 1, sameAs: "k1"},
		)
	}

	first := map[string][]byte{}
	for _, s := range steps {
		var headers []string
		for _, k := range s.keys {
			headers = append(headers, httpapi.KeyHeader, k)
		}
		if s.contentType != "" {
			headers = append(headers, "Content-Type", s.contentType)
		}
		switch {
		case s.authz == noAuthz:
		case s.authz != "":
			headers = append(headers, "Authorization", s.authz)
		case tg.Token != "":
			headers = append(headers, "Authorization", "Bearer "+tg.Token)
		}
		res := apitest.Do(t, http.MethodPost, tg.URL, s.body, headers...)
		require.Equal(t, s.status, res.Status, "%s: %s", s.situation, res.Body)
		require.Equal(t, s.replayed, res.Header.Get(httpapi.ReplayedHeader) == "true", s.situation)
		if s.status == http.StatusUnauthorized {
			require.True(t, strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer "), "%s: a 401 carries its challenge", s.situation)
		}
		if s.problem != "" {
			p := res.Problem(t)
			require.Equal(t, s.problem, p.Type, s.situation)
			require.Equal(t, s.fields, p.Fields(), s.situation)
		}
		switch {
		case s.sameAs != "":
			require.Equal(t, string(first[s.sameAs]), string(res.Body), "%s: a replay returns the stored body", s.situation)
		case len(s.keys) == 1 && s.status < 400 && s.authz != "":
			first["other:"+s.keys[0]] = res.Body
		case len(s.keys) == 1 && s.status != 400 && s.status != 422 && s.status != 401:
			first[s.keys[0]] = res.Body
		}
		require.Equal(t, s.created, tg.Created(t), s.situation)
	}
	keyInProgress(t, tg, steps[len(steps)-1].created)
}

// keyInProgress: a request whose key another request holds in an open
// transaction waits, then gets 409 with Retry-After; the key is not
// consumed and nothing is created.
func keyInProgress(t *testing.T, tg Target, created int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := tg.DB.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "INSERT INTO inbox (caller, idempotency_key, request_hash, request) VALUES ($1, 'held', '\\x00', '{}')", tg.Caller)
	require.NoError(t, err)

	headers := []string{httpapi.KeyHeader, "held"}
	if tg.Token != "" {
		headers = append(headers, "Authorization", "Bearer "+tg.Token)
	}
	res := apitest.Do(t, http.MethodPost, tg.URL, Body("Eve", "eve@example.com", "555-5"), headers...)
	require.Equal(t, http.StatusConflict, res.Status, "key in progress: %s", res.Body)
	require.Equal(t, httpapi.TypeIdempotencyBusy, res.Problem(t).Type)
	require.Equal(t, "1", res.Header.Get("Retry-After"))
	require.Equal(t, created, tg.Created(t), "key in progress")
}
