package store

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestRoundTrips counts what a delivery sends to the database: each Exec,
// Query, QueryRow and batch is one round trip, and a request waits for every
// one of them, so a statement added to the path shows here. A first
// delivery: BEGIN with its lock timeout and the key's claim (one batch), the
// user, the stored outcome, COMMIT. A replay reads the stored answer and
// counts the replay instead.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var trips tripCounter
	s := New(tracedPool(t, &trips), time.Second, 5*time.Second)
	answer := func(u User, err error) (inbox.Outcome, error) {
		switch {
		case errors.Is(err, ErrDocumentTaken):
			return inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{}`)}, nil
		case err != nil:
			return inbox.Outcome{}, err
		}
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{}`), ResourceID: u.ID}, nil
	}
	deliver := func(key, doc string) []string {
		t.Helper()
		trips.reset()
		_, _, err := s.CreateUser(ctx, inbox.Key{Caller: "outbox-sender", Value: key},
			person.Person{Name: "Ada", Email: "ada@example.com", DocumentNumber: doc}, answer)
		require.NoError(t, err)
		return trips.reset()
	}

	require.Len(t, deliver("k1", "111-1"), 4, "first delivery")
	require.Len(t, deliver("k1", "111-1"), 4, "replay")
	require.Len(t, deliver("k2", "111-1"), 4, "first delivery, document number taken")
}

// tracedPool is a pool as users_app on a fresh database whose every
// statement and batch is counted by trips.
func tracedPool(t *testing.T, trips *tripCounter) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.RoleURL(t, pgtest.URL(t, migrations.Users), migrations.UsersApp))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// tripCounter records the SQL of each round trip: one per Exec, Query and
// QueryRow, and one per batch, however many statements it carries.
type tripCounter struct {
	mu    sync.Mutex
	trips []string
}

func (c *tripCounter) add(sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips = append(c.trips, sql)
}

// reset returns the trips recorded so far and forgets them.
func (c *tripCounter) reset() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	trips := c.trips
	c.trips = nil
	return trips
}

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.add(data.SQL)
	return ctx
}

func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	sqls := make([]string, len(data.Batch.QueuedQueries))
	for i, q := range data.Batch.QueuedQueries {
		sqls[i] = q.SQL
	}
	c.add("batch: " + strings.Join(sqls, "; "))
	return ctx
}

func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
