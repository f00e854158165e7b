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
// The setting and the claim go to the server together, as one batch with
// one Sync, so they share one implicit transaction and one round trip;
// set_config(…, true) lasts until that transaction ends.
type noFlushWait struct{ pool *pgxpool.Pool }

const noFlushWaitSQL = "SELECT set_config('synchronous_commit', 'off', true)"

func (n noFlushWait) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	batch := &pgx.Batch{}
	batch.Queue(noFlushWaitSQL)
	batch.Queue(sql, args...)
	results := n.pool.SendBatch(ctx, batch)
	if _, err := results.Exec(); err != nil {
		return nil, errors.Join(err, results.Close())
	}
	rows, err := results.Query() //nolint:rowserrcheck // the caller reads the rows and their Err
	if err != nil {
		return nil, errors.Join(err, results.Close())
	}
	return &batchRows{Rows: rows, results: results}, nil
}

// The claims only query; Exec and QueryRow complete outboxdb.DBTX.
func (n noFlushWait) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("store: noFlushWait runs queries only")
}

func (n noFlushWait) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{errors.New("store: noFlushWait runs queries only")}
}

// batchRows closes the batch, which ends the transaction and returns the
// connection to the pool, as soon as the claim's last row is read: the
// commit's outcome then shows in Err, which callers read before Close.
type batchRows struct {
	pgx.Rows
	results pgx.BatchResults
	err     error
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
	if r.results != nil {
		r.err = r.results.Close()
		r.results = nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
