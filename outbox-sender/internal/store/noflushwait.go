package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
// The setting and the claim go to the server together, as one pgx batch,
// so they share one implicit transaction and one round trip;
// set_config(…, true) lasts until that transaction ends.
//
// The claim also runs on a generic plan, as the recording does
// (genericPlans): with its LIMIT or its array of ids unknown, PostgreSQL
// planned every claim afresh, and the generic plan is the same scan of
// outbox_due_idx for one row and for a batch (docs/performance.md).
type noFlushWait struct{ pool *pgxpool.Pool }

const noFlushWaitSQL = "SELECT set_config('synchronous_commit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"

// Query sends the settings and the claim in one batch, and returns the
// claim's rows. Reading them to the end (or closing them) ends the batch,
// and so commits the transaction: its error shows in the rows' Err.
func (n noFlushWait) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	b := &pgx.Batch{}
	b.Queue(noFlushWaitSQL)
	b.Queue(sql, args...)
	br := n.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close() // the same error, or nothing more
		return nil, err
	}
	rows, err := br.Query() //nolint:rowserrcheck // the caller reads the rows and their Err
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// The claims only query; Exec and QueryRow complete outboxdb.DBTX.
func (n noFlushWait) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errQueriesOnly
}

func (n noFlushWait) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{} }

var errQueriesOnly = errors.New("store: noFlushWait runs queries only")

type errRow struct{}

func (errRow) Scan(...any) error { return errQueriesOnly }

// batchRows are the claim's rows. They close the batch, which ends its
// implicit transaction and frees the connection, as soon as the last row
// is read: the end's outcome then shows in Err, which sqlc's methods read
// before Close.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closeErr error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		r.closeErr, r.br = r.br.Close(), nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}
