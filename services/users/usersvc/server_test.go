package usersvc

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/contract"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

type env struct {
	url  string
	pool *pgxpool.Pool // the administrator's, to set up and inspect
	app  *pgxpool.Pool // the server's, as users_app
	srv  *Server
}

// The callers tests serve: the sender, whose token every helper below
// sends, and another caller.
const (
	senderToken = "sender-token-0123456789abcdef"
	otherToken  = "other-token-0123456789abcdef"
)

var testCallers = []auth.Credential{{Caller: "outbox-sender", Token: senderToken}, {Caller: "other", Token: otherToken}}

// asSender is the sender's Authorization header, as name, value.
var asSender = []string{"Authorization", "Bearer " + senderToken}

func newEnv(t *testing.T, cfg Config) env {
	t.Helper()
	pool := pgtest.Pool(t, migrations.Users)
	if cfg.Callers == nil {
		cfg.Callers = testCallers
	}
	if cfg.KeyWait == 0 {
		cfg.KeyWait = 5 * time.Second
	}
	if cfg.DatabaseTimeout == 0 {
		cfg.DatabaseTimeout = 10 * time.Second
	}
	// Users runs as its own role; the test inspects as the administrator.
	app := pgtest.As(t, pool, migrations.UsersApp)
	s := NewServer(slog.New(slog.DiscardHandler), app, cfg)
	ts := httptest.NewServer(s.Routes())
	t.Cleanup(ts.Close)
	return env{url: ts.URL, pool: pool, app: app, srv: s}
}

// create posts body as the sender, with key unless it is "".
func (e env) create(t *testing.T, key, body string) apitest.Response {
	t.Helper()
	return e.createAs(t, senderToken, key, body)
}

// createAs posts body with the bearer token, with key unless it is "".
func (e env) createAs(t *testing.T, token, key, body string) apitest.Response {
	t.Helper()
	headers := []string{"Authorization", "Bearer " + token}
	if key != "" {
		headers = append(headers, "Idempotency-Key", key)
	}
	return apitest.Do(t, http.MethodPost, e.url+"/users", body, headers...)
}

// get sends a GET as the sender.
func (e env) get(t *testing.T, path string) apitest.Response {
	t.Helper()
	return apitest.Do(t, http.MethodGet, e.url+path, "", asSender...)
}

func (e env) count(t *testing.T, table string) int {
	t.Helper()
	return apitest.Count(t, e.pool, "SELECT count(*) FROM "+table)
}

var body = contract.Body

var ada = body("Ada Lovelace", "ada@example.com", "111-1")

func TestCreateUserThenReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})

	first := e.create(t, "key-1", ada)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Empty(t, first.Header.Get(httpapi.ReplayedHeader), "a first answer is not a replay")
	var created CreatedUser
	first.JSON(t, &created)
	require.NotEqual(t, uuid.Nil, created.UserID)
	require.Equal(t, "created", created.Status)
	require.Equal(t, "/users/"+created.UserID.String(), first.Header.Get("Location"))

	again := e.create(t, "key-1", ada)
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, string(first.Body), string(again.Body), "a replay returns the stored body")
	require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))

	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, 1, e.count(t, "inbox"))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT replays FROM inbox WHERE idempotency_key = 'key-1'"))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM inbox WHERE resource_id = $1", created.UserID))

	got := e.get(t, "/users/"+created.UserID.String())
	require.Equal(t, http.StatusOK, got.Status)
	var u User
	got.JSON(t, &u)
	require.Equal(t, User{ID: created.UserID, Name: "Ada Lovelace", Email: "ada@example.com", DocumentNumber: "111-1", Enabled: true, CreatedAt: u.CreatedAt}, u)
}

func TestQuotedAndBareKeyAreTheSameKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	first := e.create(t, `"k-42"`, ada)
	require.Equal(t, http.StatusCreated, first.Status)
	again := e.create(t, "k-42", ada)
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, 1, e.count(t, "users"))
}

func TestCreateUserRejectsBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	tests := []struct {
		name, key, body string
		status          int
		field           string
	}{
		{name: "missing key", body: ada, status: 400, field: "Idempotency-Key"},
		{name: "malformed key", key: "two words", body: ada, status: 400, field: "Idempotency-Key"},
		{name: "unterminated quoted key", key: `"abc`, body: ada, status: 400, field: "Idempotency-Key"},
		{name: "key too long", key: strings.Repeat("k", 256), body: ada, status: 400, field: "Idempotency-Key"},
		{name: "malformed JSON", key: "bad-1", body: `{"name":`, status: 400, field: "body"},
		{name: "unknown field", key: "bad-2", body: `{"name":"A","email":"a@b.co","document_number":"123","role":"admin"}`, status: 400, field: "role"},
		{name: "missing field", key: "bad-3", body: `{"name":"A","email":"a@b.co"}`, status: 400, field: "document_number"},
		{name: "bad email", key: "bad-4", body: body("A", "nope", "123"), status: 400, field: "email"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := e.create(t, tt.key, tt.body)
			require.Equal(t, tt.status, res.Status, "%s", res.Body)
			p := res.Problem(t)
			require.Equal(t, httpapi.TypeValidation, p.Type)
			require.Contains(t, p.Fields(), tt.field)
		})
	}
	require.Equal(t, 0, e.count(t, "users"))
	require.Equal(t, 0, e.count(t, "inbox"), "a rejected request must not consume its key")

	// The key of a rejected request is still free for a valid one.
	require.Equal(t, http.StatusCreated, e.create(t, "bad-4", ada).Status)
}

func TestKeyReusedWithDifferentPayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	first := e.create(t, "key-1", ada)
	require.Equal(t, http.StatusCreated, first.Status)

	res := e.create(t, "key-1", body("Ada King", "ada@example.com", "222-2"))
	require.Equal(t, http.StatusUnprocessableEntity, res.Status)
	p := res.Problem(t)
	require.Equal(t, httpapi.TypeIdempotencyMismatch, p.Type)
	require.Equal(t, []string{"document_number", "name"}, p.Fields())
	require.NotContains(t, string(res.Body), "Ada King", "values are never echoed")
	require.NotContains(t, string(res.Body), "Ada Lovelace")

	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, 0, apitest.Count(t, e.pool, "SELECT replays FROM inbox"), "a mismatch is not a replay")
	// The original is intact: a true repeat still replays it.
	again := e.create(t, "key-1", ada)
	require.Equal(t, string(first.Body), string(again.Body))
}

func TestSamePayloadDifferentKeyIsADifferentOperation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	require.Equal(t, http.StatusCreated, e.create(t, "key-a", ada).Status)

	// The inbox does not merge keys whose payloads look alike; the business
	// rule decides, and its refusal is stored under the second key.
	taken := e.create(t, "key-b", ada)
	require.Equal(t, http.StatusConflict, taken.Status)
	require.Empty(t, taken.Header.Get(httpapi.ReplayedHeader))
	p := taken.Problem(t)
	require.Equal(t, httpapi.TypeDocumentTaken, p.Type)
	require.Equal(t, []string{"document_number"}, p.Fields())

	replay := e.create(t, "key-b", ada)
	require.Equal(t, http.StatusConflict, replay.Status)
	require.Equal(t, "true", replay.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, string(taken.Body), string(replay.Body))

	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, 2, e.count(t, "inbox"))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM inbox WHERE resource_id IS NULL AND status_code = 409"))

	// A disabled user frees the document number for a new operation.
	_, err := e.pool.Exec(context.Background(), "UPDATE users SET enabled = false")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, e.create(t, "key-c", ada).Status)
	require.Equal(t, 2, e.count(t, "users"))
}

// TestConcurrentSameKey: a hundred simultaneous requests with one key create
// one user, and every one of them gets that user's id back.
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	const n = 100
	var (
		wg      sync.WaitGroup
		results = make([]apitest.Response, n)
		start   = make(chan struct{})
	)
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = e.create(t, "same-key", ada)
		})
	}
	close(start)
	wg.Wait()

	replayed := 0
	for _, r := range results {
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, string(results[0].Body), string(r.Body))
		if r.Header.Get(httpapi.ReplayedHeader) == "true" {
			replayed++
		}
	}
	require.Equal(t, n-1, replayed, "exactly one answer is the original")
	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, 1, e.count(t, "inbox"))
	require.Equal(t, n-1, apitest.Count(t, e.pool, "SELECT replays FROM inbox"))
}

// TestConcurrentKeysSameDocument: different keys racing for one document
// number: exactly one creates, the others are refused by the business rule.
func TestConcurrentKeysSameDocument(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	const n = 20
	var (
		wg    sync.WaitGroup
		codes = make([]int, n)
	)
	for i := range n {
		wg.Go(func() { codes[i] = e.create(t, fmt.Sprintf("k-%d", i), ada).Status })
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, c)
		if c == http.StatusCreated {
			created++
		}
	}
	require.Equal(t, 1, created)
	require.Equal(t, 1, e.count(t, "users"))
	require.Equal(t, n, e.count(t, "inbox"))
}

// TestKeyInProgress: while another transaction holds the key, a request
// waits up to USERS_IDEMPOTENCY_WAIT, then answers 409 with Retry-After;
// once the holder is gone the same request goes through.
func TestKeyInProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{KeyWait: 200 * time.Millisecond})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) }) // a failed assertion must not leave the pool unclosable
	_, err = tx.Exec(ctx, `INSERT INTO inbox (caller, idempotency_key, request_hash, request) VALUES ('outbox-sender', 'busy', '\x00', '{}')`)
	require.NoError(t, err)

	started := time.Now()
	res := e.create(t, "busy", ada)
	require.Equal(t, http.StatusConflict, res.Status, "%s", res.Body)
	require.GreaterOrEqual(t, time.Since(started), 200*time.Millisecond, "it waited for the holder first")
	require.Equal(t, httpapi.TypeIdempotencyBusy, res.Problem(t).Type)
	require.Equal(t, "1", res.Header.Get("Retry-After"))

	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, http.StatusCreated, e.create(t, "busy", ada).Status)
	require.Equal(t, 1, e.count(t, "users"))
}

// TestDocumentNumberWait: a new key whose document number another request
// is inserting right now waits for it; past the wait it is a 503 with
// Retry-After (transient for the sender), not a claim about the key.
func TestDocumentNumberWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{KeyWait: 200 * time.Millisecond})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `INSERT INTO users (id, name, email, document_number) VALUES (gen_random_uuid(), 'X', 'x@example.com', '111-1')`)
	require.NoError(t, err)

	res := e.create(t, "waits", ada)
	require.Equal(t, http.StatusServiceUnavailable, res.Status, "%s", res.Body)
	require.Equal(t, httpapi.TypeUnavailable, res.Problem(t).Type)
	require.Equal(t, "1", res.Header.Get("Retry-After"))
	require.Equal(t, 0, e.count(t, "inbox"), "nothing is stored: the retry decides")

	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, http.StatusCreated, e.create(t, "waits", ada).Status)
}

func TestTwoKeyHeadersAreRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	res := apitest.Do(t, http.MethodPost, e.url+"/users", ada, append([]string{"Idempotency-Key", "a", "Idempotency-Key", "b"}, asSender...)...)
	require.Equal(t, http.StatusBadRequest, res.Status)
	p := res.Problem(t)
	require.Equal(t, []string{"Idempotency-Key"}, p.Fields())
	require.Contains(t, p.Detail, "one Idempotency-Key header, not 2")
	require.Equal(t, 0, e.count(t, "inbox"))
}

func TestUnknownRoutesAreProblems(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	res := apitest.Do(t, http.MethodGet, e.url+"/nope", "")
	require.Equal(t, http.StatusNotFound, res.Status)
	require.Equal(t, httpapi.TypeNotFound, res.Problem(t).Type)
	res = apitest.Do(t, http.MethodDelete, e.url+"/users", "")
	require.Equal(t, http.StatusMethodNotAllowed, res.Status)
	require.Equal(t, httpapi.TypeMethodNotAllowed, res.Problem(t).Type)
}

func TestGetUserErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	res := e.get(t, "/users/not-a-uuid")
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"id"}, res.Problem(t).Fields())

	res = e.get(t, "/users/"+uuid.NewString())
	require.Equal(t, http.StatusNotFound, res.Status)
	require.Equal(t, httpapi.TypeNotFound, res.Problem(t).Type)
}

func TestHealth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, e.url+"/healthz", "").Status)
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, e.url+"/readyz", "").Status)
	e.app.Close()
	res := apitest.Do(t, http.MethodGet, e.url+"/readyz", "")
	require.Equal(t, http.StatusServiceUnavailable, res.Status)
	require.Equal(t, httpapi.TypeUnavailable, res.Problem(t).Type)
}

// TestInboxPurge: rows older than the retention window go, in batches;
// younger rows and every user stay. A purged key is forgotten, which is why
// the retention must outlast the sender's retry horizon (SENDER_MAX_AGE).
func TestInboxPurge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	for i := range 7 {
		require.Equal(t, http.StatusCreated, e.create(t, fmt.Sprintf("k-%d", i), body("A", "a@b.co", fmt.Sprintf("doc-%d", i))).Status)
	}
	_, err := e.pool.Exec(context.Background(),
		"UPDATE inbox SET created_at = now() - interval '8 days' WHERE idempotency_key IN ('k-0','k-1','k-2','k-3','k-4')")
	require.NoError(t, err)

	n, err := e.srv.store.Inbox.Purge(context.Background(), 7*24*time.Hour, 2)
	require.NoError(t, err)
	require.EqualValues(t, 5, n, "three batches of at most two")
	require.Equal(t, 2, e.count(t, "inbox"))
	require.Equal(t, 7, e.count(t, "users"))

	// The loop purges on start and stops with its context.
	_, err = e.pool.Exec(context.Background(), "UPDATE inbox SET created_at = now() - interval '1 hour'")
	require.NoError(t, err)
	stop := apitest.Start(t, func(ctx context.Context) error {
		e.srv.store.Inbox.PurgeLoop(ctx, slog.New(slog.DiscardHandler), 30*time.Minute, time.Hour)
		return nil
	})
	require.Eventually(t, func() bool { return e.count(t, "inbox") == 0 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, stop())
}

// TestCallersAuthenticate: the API answers only a known caller's token. A
// request without one, with a wrong one or with a malformed header is a
// 401 with a challenge, written before the body is read: nothing is
// created and its key stays free. The health routes need no token.
func TestCallersAuthenticate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	tests := []struct {
		name      string
		authz     []string
		challenge string
	}{
		{name: "no token", challenge: `Bearer realm="users"`},
		{name: "wrong token", authz: []string{"Bearer " + senderToken + "-not"}, challenge: `Bearer realm="users", error="invalid_token"`},
		{name: "token of nobody", authz: []string{"Bearer nobody-token-0123456789abc"}, challenge: `Bearer realm="users", error="invalid_token"`},
		{name: "malformed header", authz: []string{senderToken}, challenge: `Bearer realm="users", error="invalid_token"`},
		{name: "two headers", authz: []string{"Bearer " + senderToken, "Bearer " + otherToken}, challenge: `Bearer realm="users", error="invalid_token"`},
	}
	for _, tt := range tests {
		headers := []string{"Idempotency-Key", "auth-1"}
		for _, a := range tt.authz {
			headers = append(headers, "Authorization", a)
		}
		// A body that is not even valid: the 401 comes before it is read.
		for _, res := range []apitest.Response{
			apitest.Do(t, http.MethodPost, e.url+"/users", ada, headers...),
			apitest.Do(t, http.MethodPost, e.url+"/users", `{"name":`, headers...),
			apitest.Do(t, http.MethodGet, e.url+"/users/"+uuid.NewString(), "", headers[2:]...),
		} {
			require.Equal(t, http.StatusUnauthorized, res.Status, "%s: %s", tt.name, res.Body)
			require.Equal(t, httpapi.TypeUnauthorized, res.Problem(t).Type, tt.name)
			require.Equal(t, tt.challenge, res.Header.Get("WWW-Authenticate"), tt.name)
			require.NotContains(t, string(res.Body), senderToken, "%s: the token is never echoed", tt.name)
		}
	}
	require.Equal(t, 0, e.count(t, "users"))
	require.Equal(t, 0, e.count(t, "inbox"), "a refused request consumes no key")
	require.Equal(t, http.StatusCreated, e.create(t, "auth-1", ada).Status, "the key is still free")

	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, e.url+"/healthz", "").Status)
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, e.url+"/readyz", "").Status)

	// With no callers configured nothing gets in: secure by default.
	closed := newEnv(t, Config{Callers: []auth.Credential{}})
	require.Equal(t, http.StatusUnauthorized, closed.create(t, "auth-2", ada).Status)
}

// TestKeysAreScopedPerCaller: the same key from two callers is two
// operations. Each gets its own 201 for its own request; neither is a
// replay of the other's, and neither gets a 422 that would name the fields
// in which the other caller's request differs.
func TestKeysAreScopedPerCaller(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	bob := body("Bob Stone", "bob@example.com", "222-2")

	mine := e.create(t, "shared-key", ada)
	require.Equal(t, http.StatusCreated, mine.Status, "%s", mine.Body)
	theirs := e.createAs(t, otherToken, "shared-key", bob)
	require.Equal(t, http.StatusCreated, theirs.Status, "%s", theirs.Body)
	require.Empty(t, theirs.Header.Get(httpapi.ReplayedHeader))
	require.NotEqual(t, string(mine.Body), string(theirs.Body))
	require.NotContains(t, string(theirs.Body), "Ada")

	// Each caller's repeat replays its own answer.
	again := e.createAs(t, otherToken, "shared-key", bob)
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, string(theirs.Body), string(again.Body))
	again = e.create(t, "shared-key", ada)
	require.Equal(t, string(mine.Body), string(again.Body))

	// A mismatch is judged against the caller's own first request only.
	res := e.createAs(t, otherToken, "shared-key", body("Bob Stone", "bob@example.org", "222-2"))
	require.Equal(t, http.StatusUnprocessableEntity, res.Status)
	require.Equal(t, []string{"email"}, res.Problem(t).Fields(), "the fields differ from the other caller's own request, not the sender's")

	require.Equal(t, 2, e.count(t, "users"))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM inbox WHERE caller = 'outbox-sender' AND idempotency_key = 'shared-key'"))
	require.Equal(t, 1, apitest.Count(t, e.pool, "SELECT count(*) FROM inbox WHERE caller = 'other' AND idempotency_key = 'shared-key'"))

	// The caller is on each request's log line.
	url, logs := serveOn(t, pgtest.RoleURL(t, pgtest.URL(t, migrations.Users), migrations.UsersApp), Config{KeyWait: time.Second, DatabaseTimeout: 5 * time.Second}, slog.LevelDebug)
	require.Equal(t, http.StatusCreated, apitest.Do(t, http.MethodPost, url+"/users", ada, "Idempotency-Key", "log-1", "Authorization", "Bearer "+otherToken).Status)
	require.Contains(t, logs.String(), `"caller":"other"`)
	require.NotContains(t, logs.String(), otherToken)
}
