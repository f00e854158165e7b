package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/database"
)

// noFlushWait runs each claim in a transaction whose commit does not wait
// for its WAL to reach the disk (synchronous_commit off, for that
// transaction only): the claim is visible at once, and a flush is saved on
// every delivery's path.
//
// Losing a claim is safe. A database crash in the few hundred milliseconds
// before the flush only undoes the lease: the row is due again, is
// delivered again, and Users replays its answer; the lost lease token
// fences off nothing but this sender's retry of it. Whatever records an
// answer commits synchronously, and WAL is flushed in order, so the claim
// is durable by then anyway.
//
// The setting and the claim go to the server together, as one batch with
// one Sync, so they share one implicit transaction and one round trip;
// set_config(…, true) lasts until that transaction ends.
//
// The claim also runs on a generic plan, as the recording does
// (genericPlans): with its LIMIT or its array of ids unknown, PostgreSQL
// planned every claim afresh, and the generic plan is the same scan of
// outbox_due_idx for one row and for a batch (docs/performance.md).
type noFlushWait struct{ pool *pgxpool.Pool }

const noFlushWaitSQL = "SELECT set_config('synchronous_commit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"

func (n noFlushWait) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	before := &pgx.Batch{}
	before.Queue(noFlushWaitSQL)
	return database.QueryAfter(ctx, n.pool, before.QueuedQueries, sql, args...) //nolint:rowserrcheck // the caller reads the rows and their Err
}

// The claims only query; Exec and QueryRow complete outboxdb.DBTX.
func (n noFlushWait) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("store: noFlushWait runs queries only")
}

func (n noFlushWait) QueryRow(context.Context, string, ...any) pgx.Row {
	return database.ErrRow{Err: errors.New("store: noFlushWait runs queries only")}
}
