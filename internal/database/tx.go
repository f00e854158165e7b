package database

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is a transaction that spends no round trip of its own on BEGIN or
// COMMIT: BEGIN goes out in one pipelined batch with the transaction's
// first statements, and COMMIT with its last (Commit's batch).
//
// Round trips are most of what a transaction of a few small statements
// costs at a middling rate: each one wakes the client and the server's
// backend from sleep, and on two cores make bench measured those wake-ups
// as a larger cost than the statements' work (docs/performance.md).
// PostgreSQL runs a pipeline's statements in order in the one session and
// skips everything after a failure up to the batch's end, so pipelining
// changes only the waiting between statements, never what a transaction
// holds: a failed statement still aborts the transaction, and a COMMIT
// queued after it never runs.
//
// End must be called once the transaction is over, committed or not: it
// rolls back what did not commit and hands the connection back.
type Tx struct {
	conn *pgxpool.Conn
	// pending is BEGIN and Begin's statements until something is sent:
	// they go out ahead of it.
	pending []*pgx.QueuedQuery
	// atCommit is what WithCommit, ReadAtCommit and RunAtCommit queued,
	// in the order they were called; readers run once the transaction
	// has committed. withCallback: WithCommit was given a callback.
	atCommit     []*pgx.QueuedQuery
	readers      []func()
	withCallback bool
	// after is what AfterCommit queued, and afterFailed what it was given.
	after       []*pgx.QueuedQuery
	afterFailed []func(error)
}

// Begin takes a connection from pool for a transaction. Nothing is sent
// yet: BEGIN and first's statements (nil for none) go out ahead of the
// transaction's first statement, in the same round trip, and their
// callbacks (QueuedQuery.Exec...) run then. The Tx must be ended (End),
// even when err is not nil.
func Begin(ctx context.Context, pool *pgxpool.Pool, first *pgx.Batch) (*Tx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return &Tx{}, err
	}
	t := &Tx{conn: conn}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	t.pending = b.QueuedQueries
	if first != nil {
		t.pending = append(t.pending, first.QueuedQueries...)
	}
	return t, nil
}

// batch is what is pending followed by qs; nothing is pending after.
func (t *Tx) batch(qs []*pgx.QueuedQuery) *pgx.Batch {
	b := &pgx.Batch{QueuedQueries: append(t.pending, qs...)}
	t.pending = nil
	return b
}

// Send sends b's statements now, in one round trip (with BEGIN and Begin's
// statements if they are still pending), and runs their callbacks. It
// returns the first error.
func (t *Tx) Send(ctx context.Context, b *pgx.Batch) error {
	return t.conn.SendBatch(ctx, t.batch(b.QueuedQueries)).Close()
}

// Exec runs a statement in the transaction.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.pending == nil {
		return t.conn.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue(sql, args...).Exec(func(ct pgconn.CommandTag) error {
		tag = ct
		return nil
	})
	err := t.Send(ctx, b)
	return tag, err
}

// Query runs a query in the transaction.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.pending == nil {
		return t.conn.Query(ctx, sql, args...) //nolint:rowserrcheck // the caller reads the rows and their Err
	}
	before := t.pending
	t.pending = nil
	return QueryAfter(ctx, t.conn, before, sql, args...) //nolint:rowserrcheck // the caller reads the rows and their Err
}

// QueryRow runs a query that returns at most one row in the transaction.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.pending == nil {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...) //nolint:rowserrcheck // firstRow's Scan reads Err
	if err != nil {
		return ErrRow{err}
	}
	return firstRow{rows}
}

// WithCommit queues b's statements to go out with COMMIT, in Commit's
// round trip, ahead of last's (Commit's argument): for a step deep inside
// an operation that adds a write to the transaction but needs no answer
// from it. They are the transaction's like any other, so a failure stops
// the commit; as with Commit's, they may not have callbacks.
func (t *Tx) WithCommit(b *pgx.Batch) {
	t.withCallback = t.withCallback || hasCallback(b.QueuedQueries)
	t.atCommit = append(t.atCommit, b.QueuedQueries...)
}

// ReadAtCommit queues a query that returns at most one row to go out
// with COMMIT, in Commit's round trip, in order with WithCommit's
// statements and ahead of Commit's own: for a statement whose answer
// decides nothing the transaction still sends (a lone INSERT … RETURNING,
// say). It saves the round trip the query would take alone. A failure of
// the query stops the commit, as any statement's does. read gets the row
// once the transaction has committed, before Commit returns, and not if
// it did not. The row is only decoded then, in read's Scan: a Scan error
// (pgx.ErrNoRows among them) is read's to keep and its caller's to act
// on, for the transaction has committed.
func (t *Tx) ReadAtCommit(read func(pgx.Row), sql string, args ...any) {
	rows := t.readLater(sql, args)
	t.readers = append(t.readers, func() { read(rows.first()) })
}

// readLater queues a query at COMMIT whose rows are kept undecoded: a
// decoding error here would fail the batch's later results, COMMIT's
// among them, after the server ran it.
func (t *Tx) readLater(sql string, args []any) *lateRows {
	rows := &lateRows{}
	b := &pgx.Batch{}
	b.Queue(sql, args...).Query(func(r pgx.Rows) error {
		rows.keep(r)
		return nil
	})
	t.atCommit = append(t.atCommit, b.QueuedQueries...)
	return rows
}

// lateRows are a query's rows kept as the server sent them, decoded by
// Scan.
type lateRows struct {
	types  *pgtype.Map
	fields []pgconn.FieldDescription
	values [][][]byte
	tag    pgconn.CommandTag
}

func (r *lateRows) keep(rows pgx.Rows) {
	// Next first: rows of a statement that failed have no fields to
	// describe, and say so by ending at once (pgx returns their error).
	for rows.Next() {
		if r.types == nil {
			r.types, r.fields = rows.TypeMap(), slices.Clone(rows.FieldDescriptions())
		}
		row := make([][]byte, 0, len(r.fields))
		for _, v := range rows.RawValues() {
			row = append(row, bytes.Clone(v)) // the buffer is reused; nil (NULL) stays nil
		}
		r.values = append(r.values, row)
	}
	r.tag = rows.CommandTag()
}

func (r *lateRows) scan(row [][]byte, dest []any) error {
	if len(dest) != len(row) {
		return fmt.Errorf("database: %d columns, scanned into %d", len(row), len(dest))
	}
	for i, d := range dest {
		if err := r.types.Scan(r.fields[i].DataTypeOID, r.fields[i].Format, row[i], d); err != nil {
			return fmt.Errorf("database: scan column %s: %w", r.fields[i].Name, err)
		}
	}
	return nil
}

// first is the first row, as pgx's QueryRow gives it: pgx.ErrNoRows for
// none.
func (r *lateRows) first() pgx.Row {
	if len(r.values) == 0 {
		return ErrRow{pgx.ErrNoRows}
	}
	return lateRow{r, r.values[0]}
}

type lateRow struct {
	rows *lateRows
	row  [][]byte
}

func (r lateRow) Scan(dest ...any) error { return r.rows.scan(r.row, dest) }

// cursor reads kept rows as pgx.Rows, for a sqlc method of many rows.
type cursor struct {
	*lateRows
	n int // rows read by Next
}

func (c *cursor) Next() bool {
	if c.n == len(c.values) {
		return false
	}
	c.n++
	return true
}

func (c *cursor) Scan(dest ...any) error {
	if c.n == 0 {
		return errors.New("database: Scan before Next")
	}
	return c.scan(c.values[c.n-1], dest)
}

func (c *cursor) Values() ([]any, error) {
	if c.n == 0 {
		return nil, errors.New("database: Values before Next")
	}
	values := make([]any, len(c.fields))
	for i, f := range c.fields {
		if err := c.types.Scan(f.DataTypeOID, f.Format, c.values[c.n-1][i], &values[i]); err != nil {
			return nil, fmt.Errorf("database: decode column %s: %w", f.Name, err)
		}
	}
	return values, nil
}

func (c *cursor) RawValues() [][]byte {
	if c.n == 0 {
		return nil
	}
	return c.values[c.n-1]
}

func (c *cursor) FieldDescriptions() []pgconn.FieldDescription { return c.fields }

func (c *cursor) CommandTag() pgconn.CommandTag { return c.tag }

func (c *cursor) TypeMap() *pgtype.Map { return c.types }

func (c *cursor) Err() error { return nil }

func (c *cursor) Close() {}

func (c *cursor) Conn() *pgx.Conn { return nil }

// DBTX is what sqlc's methods run statements on: a pool, a Tx, a Later.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// RunAtCommit is ReadAtCommit for a sqlc method (:one or :many), whose
// statement text sqlc keeps to itself: call runs the method on the DBTX it
// is given. It is run twice: now, on a DBTX that only notes the statement
// and its arguments (the method gets errNotYet), and again once the
// transaction has committed, on a DBTX that hands the method the rows.
// What the second run gets is what counts; if the commit fails, no second
// run comes.
func (t *Tx) RunAtCommit(call func(db DBTX)) {
	var noted noteCall
	call(&noted)
	if noted.sql == "" {
		panic("database: RunAtCommit's call ran no query")
	}
	rows := t.readLater(noted.sql, noted.args)
	t.readers = append(t.readers, func() { call(keptDB{rows}) })
}

// errNotYet is what a method run by RunAtCommit gets on its first run.
var errNotYet = errors.New("database: the statement runs at COMMIT")

// noteCall notes the statement of a method's query (RunAtCommit).
type noteCall struct {
	sql  string
	args []any
}

func (n *noteCall) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	n.sql, n.args = sql, args
	return ErrRow{errNotYet}
}

func (n *noteCall) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	n.sql, n.args = sql, args
	return nil, errNotYet
}

func (n *noteCall) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotLater
}

// keptDB hands a method the rows its statement returned (RunAtCommit).
type keptDB struct{ rows *lateRows }

func (k keptDB) QueryRow(context.Context, string, ...any) pgx.Row { return k.rows.first() }

func (k keptDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return &cursor{lateRows: k.rows}, nil
}

func (k keptDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotLater
}

// AfterCommit queues b's statements to follow COMMIT in Commit's round
// trip. They run only if the transaction committed, in a transaction of
// their own that the end of the batch commits. Their failure cannot undo
// the commit, so Commit does not return it: failed (nil for none) gets it
// instead.
func (t *Tx) AfterCommit(b *pgx.Batch, failed func(error)) {
	t.after = append(t.after, b.QueuedQueries...)
	if failed != nil {
		t.afterFailed = append(t.afterFailed, failed)
	}
}

// errCommitCallback: a statement sent with COMMIT has a callback. The
// server runs COMMIT whatever the callback says, so its error would report
// a committed transaction as failed.
var errCommitCallback = errors.New("database: statements sent with COMMIT cannot have callbacks (a callback's error cannot stop the commit)")

// Commit sends last's statements (nil for none) and COMMIT in one round
// trip (and what AfterCommit queued). A statement that fails leaves the
// transaction uncommitted (End rolls it back); so does a transaction an
// earlier failure aborted (pgx.ErrTxCommitRollback, and nothing is sent).
// The statements that go with COMMIT (WithCommit's, ReadAtCommit's and
// RunAtCommit's in the order they were queued, then last's) run in that
// order. WithCommit's and last's, Begin's too if nothing was sent before,
// may not have callbacks (errCommitCallback): only their errors count, and
// those stop the commit.
func (t *Tx) Commit(ctx context.Context, last *pgx.Batch) error {
	if t.pending == nil && t.conn.Conn().PgConn().TxStatus() == 'E' {
		return pgx.ErrTxCommitRollback
	}
	if t.withCallback || hasCallback(t.pending) || last != nil && hasCallback(last.QueuedQueries) {
		return errCommitCallback
	}
	// The reads' callbacks always return nil: they cannot stop what the
	// server runs, and do not pretend to.
	b := &pgx.Batch{QueuedQueries: slices.Clone(t.atCommit)}
	if last != nil {
		b.QueuedQueries = append(b.QueuedQueries, last.QueuedQueries...)
	}
	var tag pgconn.CommandTag
	b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error {
		tag = ct
		return nil
	})
	b.QueuedQueries = append(b.QueuedQueries, t.after...)
	err := t.Send(ctx, b)
	switch {
	case tag.String() == "COMMIT":
		// Committed: an error now is one of the statements after it.
		if err != nil {
			for _, failed := range t.afterFailed {
				failed(err)
			}
		}
		for _, read := range t.readers {
			read()
		}
		return nil
	case err != nil:
		return err
	}
	return pgx.ErrTxCommitRollback
}

func hasCallback(qs []*pgx.QueuedQuery) bool {
	return slices.ContainsFunc(qs, func(qq *pgx.QueuedQuery) bool { return qq.Fn != nil })
}

// End rolls back whatever did not commit and hands the connection back to
// its pool. A connection whose rollback fails (ctx ended, the server gone)
// is not reused: the pool closes a connection that is not idle.
func (t *Tx) End(ctx context.Context) {
	if t.conn == nil {
		return
	}
	if t.pending == nil && t.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = t.conn.Exec(ctx, "ROLLBACK")
	}
	t.conn.Release()
	t.conn = nil
}

// Later collects statements to send later, in a batch (Tx.Commit's, say),
// through the same calls a statement is run with: sqlc's methods for
// statements whose result is not needed (:exec) queue into it unchanged,
// with their parameters in the order sqlc gives them.
type Later struct{ pgx.Batch }

// Exec queues the statement; it cannot fail now.
func (l *Later) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	l.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// errNotLater: a statement whose rows are read cannot wait for a batch.
var errNotLater = errors.New("database: a query that returns rows cannot be sent later")

// Query refuses: its rows would be read before they exist.
func (l *Later) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errNotLater
}

// QueryRow refuses, as Query does.
func (l *Later) QueryRow(context.Context, string, ...any) pgx.Row {
	return ErrRow{errNotLater}
}

// BatchSender sends a batch: a pool, or one of its connections.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// QueryAfter sends before's statements and then the query, in one batch
// and so in one round trip, and returns the query's rows. Without BEGIN
// among them, the batch is one implicit transaction that commits as it
// ends. before's callbacks run as their results arrive, and the first
// error is returned: a statement's, after which the server ran nothing
// more, or a callback's, which cannot stop what the server runs.
func QueryAfter(ctx context.Context, s BatchSender, before []*pgx.QueuedQuery, sql string, args ...any) (pgx.Rows, error) {
	b := &pgx.Batch{QueuedQueries: before}
	b.Queue(sql, args...)
	br := s.SendBatch(ctx, b)
	for _, qq := range before {
		var err error
		if qq.Fn != nil {
			err = qq.Fn(br)
		} else {
			_, err = br.Exec()
		}
		if err != nil {
			_ = br.Close() // the same error, or nothing more
			return nil, err
		}
	}
	rows, err := br.Query() //nolint:rowserrcheck // the caller reads the rows and their Err
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// ExecAll sends qs in one batch, and so in one round trip: without BEGIN
// among them, one implicit transaction that commits as the batch ends, or
// that a failed statement rolls back whole, with nothing after it run.
// failed is the index in qs of the statement that failed, or -1 when none
// did (err is then the commit's, a refusal to send, or nil). s must not be
// a connection inside a transaction, or nothing commits as the batch ends.
// qs may not have callbacks: the caller learns what failed from failed,
// not from a callback that cannot stop the server.
func ExecAll(ctx context.Context, s BatchSender, qs []*pgx.QueuedQuery) (failed int, err error) {
	if hasCallback(qs) {
		return -1, errors.New("database: ExecAll's statements cannot have callbacks")
	}
	br := s.SendBatch(ctx, &pgx.Batch{QueuedQueries: qs})
	for i := range qs {
		if _, err := br.Exec(); err != nil {
			_ = br.Close() // the same error, or nothing more
			return i, err
		}
	}
	return -1, br.Close()
}

// batchRows are the rows of a batch's last query. They close the batch,
// which ends an implicit transaction and frees the connection, as soon as
// the last row is read: the end's outcome then shows in Err, which callers
// read before Close.
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

// firstRow is the first of rows, as pgx's QueryRow gives it: pgx.ErrNoRows
// for none.
type firstRow struct{ rows pgx.Rows }

func (r firstRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// ErrRow is a row whose query could not run: Scan returns Err.
type ErrRow struct{ Err error }

func (r ErrRow) Scan(...any) error { return r.Err }
