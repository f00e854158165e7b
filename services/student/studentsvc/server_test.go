package studentsvc

import (
	"context"
	"encoding/base64"
	"encoding/json"
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
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/contract"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

type env struct {
	url  string // sends a request without a token as the caller "client"
	raw  string // the same server as it is: a request needs its token
	pool *pgxpool.Pool
}

func newEnv(t *testing.T) env {
	t.Helper()
	return newEnvWith(t, Config{KeyWait: 5 * time.Second, DatabaseTimeout: 10 * time.Second})
}

func newEnvWith(t *testing.T, cfg Config) env {
	t.Helper()
	pool := pgtest.Pool(t, migrations.Student)
	// Student runs as its own role; the test inspects as the administrator.
	s := newTestServer(slog.New(slog.DiscardHandler), pgtest.As(t, pool, migrations.StudentApp), cfg)
	ts := httptest.NewServer(apitest.WithToken(s.Routes(), clientToken))
	t.Cleanup(ts.Close)
	raw := httptest.NewServer(s.Routes())
	t.Cleanup(raw.Close)
	return env{url: ts.URL, raw: raw.URL, pool: pool}
}

func (e env) create(t *testing.T, body string, headers ...string) apitest.Response {
	t.Helper()
	return apitest.Do(t, http.MethodPost, e.url+"/students", body, headers...)
}

func (e env) count(t *testing.T, table string) int {
	t.Helper()
	return apitest.Count(t, e.pool, "SELECT count(*) FROM "+table)
}

var body = contract.Body

var ada = body("Ada Lovelace", "ada@example.com", "111-1")

func TestCreateStudentWritesStudentAndOutboxRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res := e.create(t, ada)
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	require.Equal(t, "application/json", res.Header.Get("Content-Type"))
	var st Student
	res.JSON(t, &st)
	require.Equal(t, "/students/"+st.ID.String(), res.Header.Get("Location"))
	require.Equal(t, "Ada Lovelace", st.Name)
	require.Nil(t, st.UserID)
	require.Equal(t, Provisioning{State: StatePending}, st.Provisioning)

	// The outbox row carries a fresh key, the student and Users' payload.
	var (
		key       uuid.UUID
		operation string
		payload   map[string]string
		state     string
		attempts  int
	)
	require.NoError(t, e.pool.QueryRow(context.Background(),
		"SELECT idempotency_key, operation, payload, state, attempts FROM outbox WHERE student_id = $1", st.ID).
		Scan(&key, &operation, &payload, &state, &attempts))
	require.NotEqual(t, uuid.Nil, key)
	require.Equal(t, outbox.OperationCreateUser, operation)
	require.Equal(t, map[string]string{"name": "Ada Lovelace", "email": "ada@example.com", "document_number": "111-1"}, payload)
	require.Equal(t, "pending", state)
	require.Zero(t, attempts)

	got := apitest.Do(t, http.MethodGet, e.url+"/students/"+st.ID.String(), "")
	require.Equal(t, http.StatusOK, got.Status)
	var again Student
	got.JSON(t, &again)
	require.Equal(t, st, again)
}

// TestCreateStudentIsAtomic: when the transaction fails after the student
// row, neither the student nor the outbox row exists.
func TestCreateStudentIsAtomic(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Make every outbox insert fail: the student insert before it must
	// roll back with it.
	_, err := e.pool.Exec(context.Background(), "ALTER TABLE outbox ADD CONSTRAINT refuse_all CHECK (false) NOT VALID")
	require.NoError(t, err)
	res := e.create(t, ada)
	require.Equal(t, http.StatusInternalServerError, res.Status)
	p := res.Problem(t)
	require.Equal(t, httpapi.TypeInternal, p.Type)
	require.Empty(t, p.Detail, "5xx details are logged, never sent")
	require.NotContains(t, string(res.Body), "refuse_all")
	require.Equal(t, 0, e.count(t, "students"))
	require.Equal(t, 0, e.count(t, "outbox"))
}

func TestCreateStudentRejectsBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tests := []struct {
		name, body string
		headers    []string
		status     int
		fields     []string
	}{
		{name: "malformed JSON", body: `{"name":"A"`, status: 400, fields: []string{"body"}},
		{name: "unknown field", body: `{"name":"A","email":"a@b.co","document_number":"123","id":"x"}`, status: 400, fields: []string{"id"}},
		{name: "missing fields", body: `{"name":"A"}`, status: 400, fields: []string{"email", "document_number"}},
		{name: "empty field", body: body("", "a@b.co", "123"), status: 400, fields: []string{"name"}},
		{name: "oversized field", body: body(strings.Repeat("a", 201), "a@b.co", "123"), status: 400, fields: []string{"name"}},
		{name: "malformed key", body: ada, headers: []string{"Idempotency-Key", "a b"}, status: 400, fields: []string{"Idempotency-Key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := e.create(t, tt.body, tt.headers...)
			require.Equal(t, tt.status, res.Status, "%s", res.Body)
			require.Equal(t, tt.fields, res.Problem(t).Fields())
		})
	}
	huge := `{"name":"` + strings.Repeat("a", 20<<10) + `"}`
	res := e.create(t, huge)
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"body"}, res.Problem(t).Fields())

	require.Equal(t, 0, e.count(t, "students"))
	require.Equal(t, 0, e.count(t, "outbox"))
	require.Equal(t, 0, e.count(t, "inbox"))
}

// TestDocumentNumberWaitWithoutKey: even without a key, waiting on another
// request's uncommitted student with the same document number is bounded.
func TestDocumentNumberWaitWithoutKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	s := newTestServer(slog.New(slog.DiscardHandler), pgtest.As(t, pool, migrations.StudentApp), Config{KeyWait: 200 * time.Millisecond, DatabaseTimeout: 10 * time.Second})
	ts := httptest.NewServer(apitest.WithToken(s.Routes(), clientToken))
	t.Cleanup(ts.Close)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `INSERT INTO students (id, name, email, document_number) VALUES (gen_random_uuid(), 'X', 'x@example.com', '111-1')`)
	require.NoError(t, err)

	res := apitest.Do(t, http.MethodPost, ts.URL+"/students", ada)
	require.Equal(t, http.StatusServiceUnavailable, res.Status, "%s", res.Body)
	require.Equal(t, httpapi.TypeUnavailable, res.Problem(t).Type)
	require.Equal(t, "1", res.Header.Get("Retry-After"))
}

func TestDocumentNumberTaken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	require.Equal(t, http.StatusCreated, e.create(t, ada).Status)
	res := e.create(t, body("Someone Else", "else@example.com", "111-1"))
	require.Equal(t, http.StatusConflict, res.Status)
	p := res.Problem(t)
	require.Equal(t, httpapi.TypeDocumentTaken, p.Type)
	require.Equal(t, []string{"document_number"}, p.Fields())
	require.Equal(t, 1, e.count(t, "students"))
	require.Equal(t, 1, e.count(t, "outbox"))
}

func TestClientIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := e.create(t, ada, "Idempotency-Key", "client-1")
	require.Equal(t, http.StatusCreated, first.Status)
	require.Empty(t, first.Header.Get(httpapi.ReplayedHeader))

	again := e.create(t, ada, "Idempotency-Key", `"client-1"`)
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
	require.Equal(t, 1, e.count(t, "students"))
	require.Equal(t, 1, e.count(t, "outbox"))

	mismatch := e.create(t, body("Ada Lovelace", "ada@example.org", "111-1"), "Idempotency-Key", "client-1")
	require.Equal(t, http.StatusUnprocessableEntity, mismatch.Status)
	require.Equal(t, []string{"email"}, mismatch.Problem(t).Fields())

	// A refusal under a key is stored and replayed like a success.
	taken := e.create(t, body("B", "b@example.com", "111-1"), "Idempotency-Key", "client-2")
	require.Equal(t, http.StatusConflict, taken.Status)
	replay := e.create(t, body("B", "b@example.com", "111-1"), "Idempotency-Key", "client-2")
	require.Equal(t, http.StatusConflict, replay.Status)
	require.Equal(t, "true", replay.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, 1, e.count(t, "students"))
	require.Equal(t, 1, e.count(t, "outbox"))
}

func TestConcurrentSameClientKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 100
	var (
		wg      sync.WaitGroup
		results = make([]apitest.Response, n)
	)
	for i := range n {
		wg.Go(func() { results[i] = e.create(t, ada, "Idempotency-Key", "same") })
	}
	wg.Wait()
	for _, r := range results {
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, string(results[0].Body), string(r.Body))
	}
	require.Equal(t, 1, e.count(t, "students"))
	require.Equal(t, 1, e.count(t, "outbox"))
}

func TestGetStudentShowsProvisioning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var st Student
	res := e.create(t, ada)
	res.JSON(t, &st)
	get := func() Student {
		var got Student
		apitest.Do(t, http.MethodGet, e.url+"/students/"+st.ID.String(), "").JSON(t, &got)
		return got
	}
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, "UPDATE outbox SET attempts = 3, reason_class = 'users-unavailable', last_error = 'Users answered 503 Service Unavailable'")
	require.NoError(t, err)
	require.Equal(t, Provisioning{
		State: StatePending, Attempts: 3,
		Reason: &Reason{Class: "users-unavailable", Message: "Users unavailable, retrying"},
	}, get().Provisioning)

	_, err = e.pool.Exec(ctx, "UPDATE outbox SET state = 'dead', reason_class = 'refused', last_error = 'Users answered 409 Document number already in use'")
	require.NoError(t, err)
	failed := get().Provisioning
	require.Equal(t, StateFailed, failed.State)
	require.Equal(t, &Reason{Class: "refused", Message: "Refused by Users: another user has this document number"}, failed.Reason)

	userID := uuid.New()
	_, err = e.pool.Exec(ctx, "UPDATE students SET user_id = $1", userID)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, "UPDATE outbox SET state = 'delivered', last_error = NULL, reason_class = NULL")
	require.NoError(t, err)
	linked := get()
	require.Equal(t, StateLinked, linked.Provisioning.State)
	require.Equal(t, userID, *linked.UserID)
	require.Nil(t, linked.Provisioning.Reason)

	bad := apitest.Do(t, http.MethodGet, e.url+"/students/42", "")
	require.Equal(t, http.StatusBadRequest, bad.Status)
	require.Equal(t, []string{"id"}, bad.Problem(t).Fields())
	missing := apitest.Do(t, http.MethodGet, e.url+"/students/"+uuid.NewString(), "")
	require.Equal(t, http.StatusNotFound, missing.Status)
	require.Equal(t, httpapi.TypeNotFound, missing.Problem(t).Type)
}

func TestListStudentsPaginates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const total = 23
	for i := range total {
		require.Equal(t, http.StatusCreated, e.create(t, body("S", "s@example.com", fmt.Sprintf("doc-%02d", i))).Status)
	}
	var (
		seen   []string
		cursor string
		pages  int
	)
	for {
		url := e.url + "/students?limit=10"
		if cursor != "" {
			url += "&cursor=" + cursor
		}
		res := apitest.Do(t, http.MethodGet, url, "")
		require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
		var page Page
		res.JSON(t, &page)
		pages++
		for _, s := range page.Items {
			seen = append(seen, s.DocumentNumber)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	require.Equal(t, 3, pages)
	require.Len(t, seen, total)
	for i, doc := range seen {
		require.Equal(t, fmt.Sprintf("doc-%02d", i), doc, "oldest first, no gaps or repeats")
	}

	var page Page
	apitest.Do(t, http.MethodGet, e.url+"/students", "").JSON(t, &page)
	require.Len(t, page.Items, total, "default page size holds them all")

	for _, q := range []string{"limit=0", "limit=201", "limit=x", "limit=05", "limit=%2B5", "limit=", "limit=5%20"} {
		res := apitest.Do(t, http.MethodGet, e.url+"/students?"+q, "")
		require.Equal(t, http.StatusBadRequest, res.Status, q)
		require.Equal(t, []string{"limit"}, res.Problem(t).Fields())
	}
	res := apitest.Do(t, http.MethodGet, e.url+"/students?cursor=%%%", "")
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"query"}, res.Problem(t).Fields())
	res = apitest.Do(t, http.MethodGet, e.url+"/students?page=2", "")
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"page"}, res.Problem(t).Fields())
	future := base64.RawURLEncoding.EncodeToString([]byte("-300000000000000000," + uuid.NewString()))
	res = apitest.Do(t, http.MethodGet, e.url+"/students?cursor="+future, "")
	require.Equal(t, http.StatusBadRequest, res.Status, "%s", res.Body)
	require.Equal(t, []string{"cursor"}, res.Problem(t).Fields())
	res = apitest.Do(t, http.MethodGet, e.url+"/students?cursor=bm9wZQ", "")
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"cursor"}, res.Problem(t).Fields())
}

func TestStudentJSONShape(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res := e.create(t, ada)
	var m map[string]any
	require.NoError(t, json.Unmarshal(res.Body, &m))
	for _, k := range []string{"id", "name", "email", "document_number", "user_id", "created_at", "provisioning"} {
		require.Contains(t, m, k)
	}
	require.Nil(t, m["user_id"], "null until linked")
	prov, ok := m["provisioning"].(map[string]any)
	require.True(t, ok)
	require.Contains(t, prov, "reason")
	require.NotContains(t, prov, "last_error", "the sender's full error is for operators only")
}
