package e2e

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestRedriveAfterLostAnswersLinksTheSameUser is the case redrive in retry
// mode exists for: Users created the user, every answer was lost, and the
// row died of old age. A redrive keeps the key, so Users replays the answer
// it stored and the student is linked to that same user; no second user is
// ever created.
func TestRedriveAfterLostAnswersLinksTheSameUser(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	var drop atomic.Bool
	drop.Store(true)
	users := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !drop.Load() {
			f.users.ServeHTTP(w, r)
			return
		}
		// Users does the work and commits; the answer never arrives.
		f.users.ServeHTTP(httptest.NewRecorder(), r)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(users.Close)
	ids := f.postStudents(t, 1)

	cfg := sender.Config{
		UsersURL: users.URL, UsersToken: flowToken, ID: "redrive-test", BatchSize: 10, Concurrency: 2, PollInterval: 20 * time.Millisecond,
		Lease: 30 * time.Second, RequestTimeout: 2 * time.Second, MaxAttempts: 1000,
		// Five seconds of age for attempts 20-100ms apart: a loaded machine
		// managed a single attempt within one second, and so no replay.
		BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, MaxAge: 5 * time.Second,
	}
	stop := apitest.Start(t, sender.New(slog.New(slog.DiscardHandler), pgtest.As(t, f.studentPool, migrations.OutboxSender), cfg).Run)
	require.Eventually(t, func() bool {
		return apitest.Count(t, f.studentPool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND reason_class = 'expired'") == 1
	}, 30*time.Second, 20*time.Millisecond, "dead by age")
	require.NoError(t, stop())
	require.Equal(t, 1, apitest.Count(t, f.usersPool, "SELECT count(*) FROM users"), "Users created the user once")
	require.Positive(t, apitest.Count(t, f.usersPool, "SELECT replays FROM inbox"), "the lost answers were asked for again")
	var created uuid.UUID
	require.NoError(t, f.usersPool.QueryRow(context.Background(), "SELECT resource_id FROM inbox").Scan(&created))

	var st studentsvc.Student
	apitest.Do(t, http.MethodGet, f.student.URL+"/students/"+ids[0].String(), "").JSON(t, &st)
	require.Equal(t, studentsvc.StateFailed, st.Provisioning.State)
	require.Equal(t, "expired", st.Provisioning.Reason.Class)

	// The network heals; the operator redrives, keeping the key.
	drop.Store(false)
	var id int64
	require.NoError(t, f.studentPool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&id))
	done, err := deadletter.New(f.studentPool, "test", 0).Redrive(context.Background(), id, outbox.RedriveRetry, false)
	require.NoError(t, err)
	require.True(t, done.Changed)
	apitest.Do(t, http.MethodGet, f.student.URL+"/students/"+ids[0].String(), "").JSON(t, &st)
	require.Equal(t, studentsvc.StatePending, st.Provisioning.State, "the student is pending again")
	require.Equal(t, 1, st.Provisioning.Redrives)
	require.Nil(t, st.Provisioning.Reason, "a redrive clears the reason")

	cfg.MaxAge = time.Hour
	stop = apitest.Start(t, sender.New(slog.New(slog.DiscardHandler), pgtest.As(t, f.studentPool, migrations.OutboxSender), cfg).Run)
	require.Eventually(t, func() bool {
		return apitest.Count(t, f.studentPool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL") == 1
	}, 30*time.Second, 20*time.Millisecond, "linked after the redrive")
	require.NoError(t, stop())

	apitest.Do(t, http.MethodGet, f.student.URL+"/students/"+ids[0].String(), "").JSON(t, &st)
	require.Equal(t, studentsvc.StateLinked, st.Provisioning.State)
	require.Equal(t, created, *st.UserID, "linked to the user Users created before the row died")
	require.Equal(t, 1, apitest.Count(t, f.usersPool, "SELECT count(*) FROM users"), "never a second user")
}
