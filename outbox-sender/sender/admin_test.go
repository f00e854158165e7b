package sender

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestAdminPortAnswersItsHostsOnly: the admin port, its outbox routes
// included, refuses a host name it was not given (a page rebound to the
// admin address), before any token is looked at.
func TestAdminPortAnswersItsHostsOnly(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, usersURL := newFakeUsers(t, nil)
	admin := adminAPI(t, pool, New(quiet, asSender(t, pool), testConfig(usersURL)))
	apitest.RequireHostsChecked(t, admin, "SENDER_ADMIN_ALLOWED_HOSTS", "/outbox?state=dead")
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, admin+"/outbox?state=dead", "").Status)
}

// TestAdminFloodLeavesDeliveryAlone: an operator's script looping on the
// admin port, here redriving a row another session holds locked and paging
// through the outbox from 32 clients at once, does not stop delivery:
// every student created during the flood is delivered while it lasts. The
// admin routes have a pool of their own (SENDER_ADMIN_DB_MAX_CONNS), and a
// redrive never waits for a lock: redrives that waited would hold every
// connection they could take, for good. How long each delivery takes
// under the flood is a matter of the machine's load, not asserted here.
func TestAdminFloodLeavesDeliveryAlone(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t, migrations.Student)
	pool := pgtest.Connect(t, dbURL)
	_, usersURL := newFakeUsers(t, nil)
	admin := apitest.FreeAddr(t)
	env := senderEnv(t, dbURL, usersURL, admin, "SENDER_ADMIN_TOKENS", "ops:"+adminToken, "LOG_LEVEL", "error")
	var logs bytes.Buffer
	apitest.RunUntilReady(t, "http://"+admin+"/readyz", func(ctx context.Context) error { return Run(ctx, nil, env, &logs) })

	// A dead row, locked by a session that never lets go during the flood.
	addStudents(t, pool, 1)
	var locked int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&locked))
	eventually(t, "the row delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 1
	})
	_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'refused' WHERE id = $1", locked)
	require.NoError(t, err)
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(context.Background(), "SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", locked)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := range 32 {
		wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second}
			for ctx.Err() == nil {
				var req *http.Request
				if i%2 == 0 {
					req, _ = http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s/outbox/%d/redrive", admin, locked),
						bytes.NewBufferString(`{"mode":"retry"}`))
					req.Header.Set("Content-Type", "application/json")
				} else {
					req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/outbox?state=delivered&limit=200", nil)
				}
				req.Header.Set("Authorization", "Bearer "+adminToken)
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				_ = resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	time.Sleep(500 * time.Millisecond) // the flood is under way

	const n = 20
	for range n {
		addStudents(t, pool, 1)
		time.Sleep(50 * time.Millisecond)
	}
	eventually(t, "every student is delivered during the flood", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == n
	})
	cancel()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, statuses[http.StatusConflict], "the locked row's redrives were answered, as busy: %v", statuses)
	require.Positive(t, statuses[http.StatusOK], "the lists were answered: %v", statuses)
	require.Zero(t, statuses[http.StatusInternalServerError], "%v", statuses)
}
