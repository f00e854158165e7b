package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// sender is the sender's caller name at Users, the reconciler's default.
const sender = "outbox-sender"

// world is a Student database and a Users database, written by hand as the
// system (or something breaking it) would leave them. The tests write as
// the administrator; the reconciler reads as its own role.
type world struct {
	t                    *testing.T
	studentURL, usersURL string
	student, users       *pgxpool.Pool
	n                    int
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, studentURL: pgtest.URL(t, migrations.Student), usersURL: pgtest.URL(t, migrations.Users)}
	w.student, w.users = pgtest.Connect(t, w.studentURL), pgtest.Connect(t, w.usersURL)
	return w
}

// env is the reconciler's environment on the world's databases, as its
// role, with small pages so that every test reads more than one; kv adds
// to it or overrides it.
func (w *world) env(kv ...string) func(string) string {
	return apitest.Env(append([]string{
		"RECONCILER_STUDENT_DATABASE_URL", pgtest.RoleURL(w.t, w.studentURL, migrations.Reconciler),
		"RECONCILER_USERS_DATABASE_URL", pgtest.RoleURL(w.t, w.usersURL, migrations.Reconciler),
		"RECONCILER_PAGE_SIZE", "2",
		"RECONCILER_PAGE_PAUSE", "0s",
	}, kv...)...)
}

func (w *world) exec(pool *pgxpool.Pool, sql string, args ...any) {
	w.t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(w.t, err, sql)
}

// doc is a new document number.
func (w *world) doc() string {
	w.n++
	return "DOC-" + uuid.NewString()[:8]
}

// ago is a moment in the past.
func ago(d time.Duration) time.Time { return time.Now().Add(-d) }

// addStudent writes a student, linked to user when it is not uuid.Nil.
func (w *world) addStudent(doc string, created time.Time, user uuid.UUID) uuid.UUID {
	w.t.Helper()
	id := uuid.New()
	w.exec(w.student, `INSERT INTO students (id, name, email, document_number, user_id, created_at)
		VALUES ($1, 'A Student', 'a@example.com', $2, $3, $4)`, id, doc, uuid.NullUUID{UUID: user, Valid: user != uuid.Nil}, created)
	return id
}

// addOutbox writes a student's create-user row and returns its key.
func (w *world) addOutbox(student uuid.UUID, state, reason string, created time.Time) uuid.UUID {
	w.t.Helper()
	key := uuid.New()
	// Settled, for a test, at the moment it was made.
	var deadAt, deliveredAt *time.Time
	switch state {
	case outbox.StateDead:
		deadAt = &created
	case outbox.StateDelivered:
		deliveredAt = &created
	}
	w.exec(w.student, `INSERT INTO outbox (idempotency_key, operation, student_id, payload, state, reason_class, created_at, dead_at, delivered_at)
		VALUES ($1, 'create-user', $2, '{}', $3, NULLIF($4, ''), $5, $6, $7)`, key, student, state, reason, created, deadAt, deliveredAt)
	return key
}

// addUser writes a user.
func (w *world) addUser(doc string, created time.Time) uuid.UUID {
	w.t.Helper()
	id := uuid.New()
	w.exec(w.users, `INSERT INTO users (id, name, email, document_number, created_at) VALUES ($1, 'A User', 'u@example.com', $2, $3)`,
		id, doc, created)
	return id
}

// addAnswer stores what Users answered under a caller's key: the user it
// made, or (uuid.Nil) a refusal.
func (w *world) addAnswer(caller, key string, user uuid.UUID, created time.Time) {
	w.t.Helper()
	status := 201
	if user == uuid.Nil {
		status = 409
	}
	w.exec(w.users, `INSERT INTO inbox (caller, idempotency_key, request_hash, request, status_code, response_body, resource_id, created_at)
		VALUES ($1, $2, '\x00', '{}', $3, '{}', $4, $5)`, caller, key, status, uuid.NullUUID{UUID: user, Valid: user != uuid.Nil}, created)
}

// linkedStudent is the happy path, an hour old: a student, its delivered
// row, the user Users made under the row's key, and the link.
type linkedStudent struct {
	id, user, key uuid.UUID
	doc           string
}

func (w *world) linked() linkedStudent {
	w.t.Helper()
	doc := w.doc()
	user := w.addUser(doc, ago(time.Hour))
	id := w.addStudent(doc, ago(time.Hour), user)
	key := w.addOutbox(id, outbox.StateDelivered, "", ago(time.Hour))
	w.addAnswer(sender, key.String(), user, ago(time.Hour))
	return linkedStudent{id: id, user: user, key: key, doc: doc}
}

// bystanders are three linked students, for a test to break the middle
// one of while the others must stay right.
func (w *world) bystanders() []linkedStudent {
	return []linkedStudent{w.linked(), w.linked(), w.linked()}
}

// once runs `reconciler once --json` and returns its report and exit
// status.
func (w *world) once(kv ...string) (Report, int) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := Run(ctx, []string{"once", "--json"}, w.env(kv...), &out)
	code := ExitCode(err)
	require.NotEqual(w.t, 2, code, "the reconciler could not check: %v", err)
	var r Report
	require.NoError(w.t, json.Unmarshal(out.Bytes(), &r), out.String())
	return r, code
}

// counts are a report's classes with cases.
func counts(r Report) map[drift.Class]int {
	out := map[drift.Class]int{}
	for class, c := range r.Classes {
		if c.Count > 0 {
			out[class] = c.Count
		}
	}
	return out
}
