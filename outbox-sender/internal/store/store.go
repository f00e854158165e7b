// Package store is the outbox sender's store boundary: every statement the
// sender runs on Student's database goes through it. Above it, the relay
// sees claimed rows, results to record and the store's own errors; sqlc's
// row types, pgx and SQL stay here. Its errors are wrapped with
// database.ErrUnavailable when the database is down or did not answer in
// time, and ErrNotFound when a row does not exist.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// ErrNotFound: no outbox row has that id.
var ErrNotFound = errors.New("outbox row not found")

// Store reads and writes the outbox in Student's database.
type Store struct {
	pool    *pgxpool.Pool
	q       *outboxdb.Queries
	timeout time.Duration
}

// New returns a Store on pool, Student's database as the sender's role.
// timeout is the deadline of each call (SENDER_DATABASE_TIMEOUT).
func New(pool *pgxpool.Pool, timeout time.Duration) *Store {
	return &Store{pool: pool, q: outboxdb.New(), timeout: timeout}
}

// Row is an outbox row claimed for delivery.
type Row struct {
	ID             int64
	StudentID      uuid.UUID
	IdempotencyKey uuid.UUID // sent as Idempotency-Key on every delivery
	Operation      string
	Payload        []byte // the request, as Student wrote it
	Attempts       int    // claims so far, this one included
	LeaseToken     uuid.UUID
	CreatedAt      time.Time // by the database's clock
	TraceParent    string    // the trace of the request that wrote the row; "" for none
	// Expired: the operation is older than the claim's MaxAge, counted
	// from its creation or last redrive. It is dead-lettered, not sent.
	Expired bool
	// ExpiresAt is when the row expires by the database's clock: its
	// creation or last redrive plus SENDER_MAX_AGE. A command published
	// to the broker carries it, and Users does not act on it later.
	ExpiresAt time.Time
	// PublishedSeq is where the broker put the row's last published
	// command in its stream (SENDER_TRANSPORT=nats); 0: never published.
	PublishedSeq uint64
	// PublishedAgo is how long ago the broker took that command, by the
	// database's clock.
	PublishedAgo time.Duration
	// Publishes counts the publishes recorded for the row (and its
	// redrives): the broker transport names its next publish's message
	// id by it, so that a publish meant to reach Users is never dropped
	// as a repeat of the last.
	Publishes int
	// LeaseEnds is when the claim's lease runs out at the latest, by the
	// sender's own clock (the claim's start plus SENDER_LEASE); the engine
	// sets it. The zero time: unknown.
	LeaseEnds time.Time
}

// Lease is how a claim holds its rows.
type Lease struct {
	Holder string        // who claims (SENDER_ID), recorded on each row
	For    time.Duration // how long the claim lasts (SENDER_LEASE)
	MaxAge time.Duration // rows older than this come back Expired (SENDER_MAX_AGE)
}

// ClaimDue claims up to n due rows, oldest due first (ClaimDue in
// db/queries/outbox/outbox.sql).
func (s *Store) ClaimDue(ctx context.Context, l Lease, n int) ([]Row, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	rows, err := s.q.ClaimDue(ctx, noFlushWait{s.pool}, outboxdb.ClaimDueParams{
		Lease: l.For, ClaimedBy: text(l.Holder), BatchSize: int32(n), MaxAge: l.MaxAge, //nolint:gosec // n is at most SENDER_BATCH_SIZE
	})
	return claimed(rows, err, func(r outboxdb.ClaimDueRow) Row { return fromClaim(claimRow(r)) })
}

// ClaimDueLeavingNew is ClaimDue for a sender whose new rows come from a
// stream: rows younger than leaveNew that were never tried are left to it.
func (s *Store) ClaimDueLeavingNew(ctx context.Context, l Lease, n int, leaveNew time.Duration) ([]Row, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	rows, err := s.q.ClaimDueLeavingNew(ctx, noFlushWait{s.pool}, outboxdb.ClaimDueLeavingNewParams{
		Lease: l.For, ClaimedBy: text(l.Holder), LeaveNew: leaveNew, BatchSize: int32(n), MaxAge: l.MaxAge, //nolint:gosec // n is at most SENDER_BATCH_SIZE
	})
	return claimed(rows, err, func(r outboxdb.ClaimDueLeavingNewRow) Row { return fromClaim(claimRow(r)) })
}

// ClaimIDs claims those of ids that are due and not held by another
// transaction this moment (ClaimStreamed in cdc.sql).
func (s *Store) ClaimIDs(ctx context.Context, l Lease, ids []int64) ([]Row, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	rows, err := s.q.ClaimStreamed(ctx, noFlushWait{s.pool}, outboxdb.ClaimStreamedParams{
		Lease: l.For, ClaimedBy: text(l.Holder), Ids: ids, MaxAge: l.MaxAge,
	})
	return claimed(rows, err, func(r outboxdb.ClaimStreamedRow) Row { return fromClaim(claimRow(r)) })
}

// VisibleIDs returns those of ids this moment's snapshot can see.
func (s *Store) VisibleIDs(ctx context.Context, ids []int64) ([]int64, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	visible, err := s.q.VisibleOutboxIDs(ctx, s.pool, ids)
	if err != nil {
		return nil, fmt.Errorf("look up streamed rows: %w", database.Classify(err))
	}
	return visible, nil
}

// claimRow is the shape every claim query returns; sqlc gives each query
// a type of its own.
type claimRow struct {
	ID             int64
	IdempotencyKey uuid.UUID
	Operation      string
	StudentID      uuid.UUID
	Payload        []byte
	Attempts       int32
	LeaseToken     uuid.UUID
	CreatedAt      time.Time
	TraceParent    pgtype.Text
	Expired        bool
	ExpiresAt      time.Time
	PublishedSeq   int64
	Publishes      int32
	PublishedAgo   time.Duration
}

func fromClaim(r claimRow) Row {
	return Row{
		ID: r.ID, StudentID: r.StudentID, IdempotencyKey: r.IdempotencyKey, Operation: r.Operation,
		Payload: r.Payload, Attempts: int(r.Attempts), LeaseToken: r.LeaseToken, CreatedAt: r.CreatedAt,
		TraceParent: r.TraceParent.String, Expired: r.Expired, ExpiresAt: r.ExpiresAt,
		PublishedSeq: uint64(max(r.PublishedSeq, 0)), PublishedAgo: r.PublishedAgo, Publishes: int(r.Publishes),
	}
}

func claimed[R any](rows []R, err error, convert func(R) Row) ([]Row, error) {
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", database.Classify(err))
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		out[i] = convert(r)
	}
	return out, nil
}

func text(s string) pgtype.Text {
	return pgtype.Text{String: s, Valid: s != ""}
}
