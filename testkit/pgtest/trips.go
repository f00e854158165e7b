package pgtest

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Trips records the SQL of each round trip a pool makes: one per Exec,
// Query and QueryRow, and one per batch, however many statements it
// carries. A test that asserts the count shows a statement added to a hot
// path.
type Trips struct {
	mu    sync.Mutex
	trips []string
}

// TracedPool opens a pool on dbURL's database as role, closed at cleanup,
// whose every round trip is recorded in the Trips it returns.
func TracedPool(t testing.TB, dbURL, role string) (*pgxpool.Pool, *Trips) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(RoleURL(t, dbURL, role))
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	trips := &Trips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, trips
}

func (c *Trips) add(sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips = append(c.trips, sql)
}

// Take returns the trips recorded so far and forgets them.
func (c *Trips) Take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	trips := c.trips
	c.trips = nil
	return trips
}

func (c *Trips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.add(data.SQL)
	return ctx
}

func (c *Trips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *Trips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	sqls := make([]string, len(data.Batch.QueuedQueries))
	for i, q := range data.Batch.QueuedQueries {
		sqls[i] = q.SQL
	}
	c.add("batch: " + strings.Join(sqls, "; "))
	return ctx
}

func (c *Trips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *Trips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
