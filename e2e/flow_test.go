package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// flowToken is the sender's token in the in-process flows: Users lists it
// for the caller "outbox-sender", and the senders send it.
const flowToken = "flow-sender-token-0123456789"

// flow is Student and Users in one process, each on its own database.
type flow struct {
	studentPool, usersPool *pgxpool.Pool
	student                *httptest.Server
	users                  http.Handler
}

// flowClientToken is the tests' token on Student's API.
const flowClientToken = "flow-client-token-0123456789"

func newFlow(t *testing.T) flow {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	f := flow{studentPool: pgtest.Pool(t, migrations.Student), usersPool: pgtest.Pool(t, migrations.Users)}
	// Each part runs as its own database role, as in production; the
	// pools in f are the administrator's, for the tests' own reads.
	// The tests' requests go to Student as its caller "e2e-suite".
	f.student = httptest.NewServer(apitest.WithToken(studentsvc.NewServer(quiet, pgtest.As(t, f.studentPool, migrations.StudentApp), studentsvc.Config{
		Callers: []auth.Credential{{Caller: "e2e-suite", Token: flowClientToken}},
	}).Routes(), flowClientToken))
	t.Cleanup(f.student.Close)
	f.users = usersvc.NewServer(quiet, pgtest.As(t, f.usersPool, migrations.UsersApp), usersvc.Config{
		Callers: []auth.Credential{{Caller: "outbox-sender", Token: flowToken}},
	}).Routes()
	return f
}

// postStudents creates n students at once through Student's API.
func (f flow) postStudents(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	var wg sync.WaitGroup
	ids := make([]uuid.UUID, n)
	for i := range n {
		wg.Go(func() {
			res := apitest.Do(t, http.MethodPost, f.student.URL+"/students",
				fmt.Sprintf(`{"name":"Student %d","email":"s%d@example.com","document_number":"doc-%04d"}`, i, i, i))
			// No require here: FailNow must not run outside the test goroutine.
			var st studentsvc.Student
			if assert.Equal(t, http.StatusCreated, res.Status, "%s", res.Body) &&
				assert.NoError(t, json.Unmarshal(res.Body, &st)) {
				assert.Equal(t, studentsvc.StatePending, st.Provisioning.State)
				ids[i] = st.ID
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "creating students failed")
	return ids
}

func (f flow) runSender(t *testing.T, usersURL string) (stop func()) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	s := sender.New(quiet, pgtest.As(t, f.studentPool, migrations.OutboxSender), sender.Config{
		UsersURL: usersURL, UsersToken: flowToken, ID: "flow", BatchSize: 50, Concurrency: 16, PollInterval: 20 * time.Millisecond,
		Lease: 30 * time.Second, RequestTimeout: 5 * time.Second, MaxAttempts: 1000,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, MaxAge: time.Hour,
	})
	stopSender := apitest.Start(t, s.Run)
	return func() { require.NoError(t, stopSender()) }
}

// TestWholeFlow runs Student, Users and the sender in one process on two
// real databases: 200 students posted at once all end linked, each to its
// own user, with one inbox row per operation.
func TestWholeFlow(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	users := httptest.NewServer(f.users)
	t.Cleanup(users.Close)
	studentPool, usersPool, student := f.studentPool, f.usersPool, f.student

	const n = 200
	ids := f.postStudents(t, n)
	stop := f.runSender(t, users.URL)
	require.Eventually(t, func() bool {
		return apitest.Count(t, studentPool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL") == n
	}, 60*time.Second, 20*time.Millisecond, "every student linked")
	stop()

	require.Equal(t, n, apitest.Count(t, usersPool, "SELECT count(*) FROM users"))
	require.Equal(t, n, apitest.Count(t, usersPool, "SELECT count(*) FROM inbox WHERE status_code = 201"))
	require.Equal(t, n, apitest.Count(t, studentPool, "SELECT count(DISTINCT user_id) FROM students"))
	require.Equal(t, n, apitest.Count(t, studentPool, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))

	// Each student holds exactly the user its operation's key created.
	inboxResult := map[uuid.UUID]uuid.UUID{}
	rows, err := usersPool.Query(context.Background(), "SELECT idempotency_key::uuid, resource_id FROM inbox")
	require.NoError(t, err)
	for rows.Next() {
		var key, user uuid.UUID
		require.NoError(t, rows.Scan(&key, &user))
		inboxResult[key] = user
	}
	require.NoError(t, rows.Err())
	rows, err = studentPool.Query(context.Background(),
		"SELECT o.idempotency_key, s.user_id FROM students s JOIN outbox o ON o.student_id = s.id")
	require.NoError(t, err)
	linked := 0
	for rows.Next() {
		var key, user uuid.UUID
		require.NoError(t, rows.Scan(&key, &user))
		require.Equal(t, inboxResult[key], user)
		linked++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, n, linked)

	// And the API says so.
	var st studentsvc.Student
	apitest.Do(t, http.MethodGet, student.URL+"/students/"+ids[0].String(), "").JSON(t, &st)
	require.Equal(t, studentsvc.StateLinked, st.Provisioning.State)
	res := apitest.Do(t, http.MethodGet, users.URL+"/users/"+st.UserID.String(), "", "Authorization", "Bearer "+flowToken)
	require.Equal(t, http.StatusOK, res.Status)
}

// TestSenderWithWrongToken: a sender whose token Users does not list gets
// every delivery refused (401). The rows stay pending, retried with the
// reason users-auth-refused, and none is dead-lettered, even past the
// attempts cap; Users wrote nothing. With the right token they all link.
func TestSenderWithWrongToken(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	users := httptest.NewServer(f.users)
	t.Cleanup(users.Close)
	const n = 20
	f.postStudents(t, n)
	cfg := sender.Config{
		UsersURL: users.URL, UsersToken: "not-the-flow-token-0123456789", ID: "wrong-token", BatchSize: 50, Concurrency: 16,
		PollInterval: 20 * time.Millisecond, Lease: 30 * time.Second, RequestTimeout: 5 * time.Second, MaxAttempts: 2,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxAge: time.Hour,
	}
	stop := apitest.Start(t, sender.New(slog.New(slog.DiscardHandler), f.studentPool, cfg).Run)
	require.Eventually(t, func() bool {
		return apitest.Count(t, f.studentPool, "SELECT count(*) FROM outbox WHERE attempts >= 4 AND reason_class = 'users-auth-refused'") == n
	}, 30*time.Second, 20*time.Millisecond, "every row retried past the attempts cap")
	require.NoError(t, stop())
	require.Zero(t, apitest.Count(t, f.studentPool, "SELECT count(*) FROM outbox WHERE state <> 'pending'"), "nothing is dead-lettered")
	require.Zero(t, apitest.Count(t, f.usersPool, "SELECT count(*) FROM inbox"), "Users wrote nothing")
	var page studentsvc.Page
	apitest.Do(t, http.MethodGet, f.student.URL+"/students?limit=1", "").JSON(t, &page)
	require.Equal(t, studentsvc.StatePending, page.Items[0].Provisioning.State)
	require.Equal(t, "users-auth-refused", page.Items[0].Provisioning.Reason.Class)

	// The token fixed (and the cap raised: the rows used it up meanwhile).
	stopFixed := f.runSender(t, users.URL)
	require.Eventually(t, func() bool {
		return apitest.Count(t, f.studentPool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL") == n
	}, 30*time.Second, 20*time.Millisecond, "every student links with the right token")
	stopFixed()
}

// TestUsersOutage: with Users down, students stay pending while their
// attempts rise and their reason says why; once Users is back on the
// same address every one of them links, to exactly one user each.
func TestUsersOutage(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	addr := apitest.FreeAddr(t) // nothing listens here yet
	const n = 100
	f.postStudents(t, n)
	stop := f.runSender(t, "http://"+addr)

	require.Eventually(t, func() bool {
		return apitest.Count(t, f.studentPool, "SELECT count(*) FROM outbox WHERE attempts >= 3") == n
	}, 30*time.Second, 20*time.Millisecond, "attempts rise while Users is down")
	require.Zero(t, apitest.Count(t, f.studentPool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL"))
	require.Zero(t, apitest.Count(t, f.studentPool, "SELECT count(*) FROM outbox WHERE state <> 'pending'"), "nothing gives up")
	var page studentsvc.Page
	apitest.Do(t, http.MethodGet, f.student.URL+"/students?limit=1", "").JSON(t, &page)
	st := page.Items[0]
	require.Equal(t, studentsvc.StatePending, st.Provisioning.State)
	require.GreaterOrEqual(t, st.Provisioning.Attempts, 3)
	require.Equal(t, &studentsvc.Reason{Class: "users-unreachable", Message: "Users unreachable, retrying"}, st.Provisioning.Reason)

	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "Users comes back on the same address")
	users := &http.Server{Handler: f.users, ReadHeaderTimeout: 5 * time.Second}
	apitest.Start(t, func(ctx context.Context) error {
		context.AfterFunc(ctx, func() { _ = users.Close() })
		if err := users.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})

	require.Eventually(t, func() bool {
		return apitest.Count(t, f.studentPool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL") == n
	}, 30*time.Second, 20*time.Millisecond, "every student links once Users is back")
	stop()
	require.Equal(t, n, apitest.Count(t, f.usersPool, "SELECT count(*) FROM users"))
	require.Equal(t, n, apitest.Count(t, f.studentPool, "SELECT count(DISTINCT user_id) FROM students"))
}
