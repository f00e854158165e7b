package sender_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/apitest"
	"github.com/outboxref/outboxref/internal/pgtest"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
)

// TestWholeFlow runs Student, Users and the sender in one process on two
// real databases: 200 students posted at once all end linked, each to its
// own user, with one inbox row per operation.
func TestWholeFlow(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	studentPool := pgtest.Pool(t, migrations.Student)
	usersPool := pgtest.Pool(t, migrations.Users)
	student := httptest.NewServer(studentsvc.NewServer(quiet, studentPool, studentsvc.Config{}).Routes())
	t.Cleanup(student.Close)
	users := httptest.NewServer(usersvc.NewServer(quiet, usersPool, usersvc.Config{}).Routes())
	t.Cleanup(users.Close)

	const n = 200
	var wg sync.WaitGroup
	ids := make([]uuid.UUID, n)
	for i := range n {
		wg.Go(func() {
			res := apitest.Do(t, http.MethodPost, student.URL+"/students",
				fmt.Sprintf(`{"name":"Student %d","email":"s%d@example.com","document_number":"doc-%04d"}`, i, i, i))
			require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
			var st studentsvc.Student
			res.JSON(t, &st)
			require.Equal(t, studentsvc.StatePending, st.Provisioning.State)
			ids[i] = st.ID
		})
	}
	wg.Wait()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sender.New(quiet, studentPool, sender.Config{
			UsersURL: users.URL, ID: "flow", BatchSize: 50, Concurrency: 16, PollInterval: 20 * time.Millisecond,
			Lease: 30 * time.Second, RequestTimeout: 5 * time.Second, MaxAttempts: 10,
			BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, MaxAge: time.Hour,
		}).Run(ctx)
	}()
	require.Eventually(t, func() bool {
		return apitest.Count(t, studentPool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL") == n
	}, 60*time.Second, 20*time.Millisecond, "every student linked")
	cancel()
	require.NoError(t, <-done)

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
	res := apitest.Do(t, http.MethodGet, users.URL+"/users/"+st.UserID.String(), "")
	require.Equal(t, http.StatusOK, res.Status)
}
