package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/outboxwake"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// This file holds what the sender reads of the outbox as a whole and of the
// server: the figures /metrics shows, the purge, notifications and the
// replication slot.

// Stats are the outbox's figures across every sender.
type Stats struct {
	Pending, Published, Delivered, Dead int64
	// OldestPending is the age of the oldest pending row (0 when none).
	OldestPending time.Duration
	// OldestPublished is the age of the oldest published row, waiting
	// for Users' answer through the broker (0 when none).
	OldestPublished time.Duration
}

// Stats reads the outbox's figures within SENDER_DATABASE_TIMEOUT (or
// ctx's deadline, if sooner). The bound is its own, as every other read's:
// a caller that forgot one would wait on a frozen connection for ever.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	st, err := s.q.OutboxStats(ctx, s.pool)
	if err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", database.Classify(err))
	}
	return Stats{
		Pending: st.Pending, Published: st.Published, Delivered: st.Delivered, Dead: st.Dead,
		OldestPending:   time.Duration(st.OldestPendingSeconds * float64(time.Second)),
		OldestPublished: time.Duration(st.OldestPublishedSeconds * float64(time.Second)),
	}, nil
}

// PurgeDelivered deletes delivered rows older than retention, batch rows
// per statement, and returns how many it deleted. Dead rows are never
// purged.
func (s *Store) PurgeDelivered(ctx context.Context, retention time.Duration, batch int32) (int64, error) {
	return database.DeleteInBatches(ctx, s.timeout, batch, "purge delivered rows", func(ctx context.Context) (int64, error) {
		return s.q.PurgeDelivered(ctx, s.pool, outboxdb.PurgeDeliveredParams{Retention: retention, BatchSize: batch})
	})
}

// Database is the name of the database the store is on.
func (s *Store) Database() string {
	return s.pool.Config().ConnConfig.Database
}

// Listener is a connection of its own, outside the pool, that listens on
// outboxwake.Channel: a listening connection is busy for as long as it
// listens.
type Listener struct{ conn *pgx.Conn }

// Listen connects and listens.
func (s *Store) Listen(ctx context.Context) (*Listener, error) {
	cfg := s.pool.Config().ConnConfig
	// Seen in pg_stat_activity beside the pool's connections.
	cfg.RuntimeParams["application_name"] = "outbox-sender listener"
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+outboxwake.Channel); err != nil {
		return nil, errors.Join(err, conn.Close(context.WithoutCancel(ctx)))
	}
	return &Listener{conn: conn}, nil
}

// Wait returns once a notification arrives, or with the error that ended
// the connection (or ctx).
func (l *Listener) Wait(ctx context.Context) error {
	_, err := l.conn.WaitForNotification(ctx)
	return err
}

// Close ends the connection.
func (l *Listener) Close(ctx context.Context) {
	_ = l.conn.Close(ctx)
}

// Slot is a replication slot as pg_replication_slots shows it.
type Slot struct {
	Database  string // the database it decodes
	Active    bool   // a connection streams from it
	ActivePID uint32 // the server process of that connection
	Lost      bool   // invalidated: PostgreSQL removed WAL it had not confirmed
	Confirmed string // its confirmed position, as the server writes it; "" when none
	LagBytes  float64
	Retained  float64 // WAL it keeps from removal
}

// Slot reads the replication slot named name; ok is false when there is
// none. (sqlc's catalog does not know pg_replication_slots, so this one
// query is written by hand.)
func (s *Store) Slot(ctx context.Context, name string) (st Slot, ok bool, err error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	var walStatus string
	var confirmed *string
	err = s.pool.QueryRow(ctx, `
		SELECT database, active, COALESCE(active_pid, 0), COALESCE(wal_status, ''), confirmed_flush_lsn::text,
		       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::float8,
		       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::float8
		FROM pg_replication_slots WHERE slot_name = $1`, name).
		Scan(&st.Database, &st.Active, &st.ActivePID, &walStatus, &confirmed, &st.LagBytes, &st.Retained)
	if errors.Is(err, pgx.ErrNoRows) {
		return Slot{}, false, nil
	}
	if err != nil {
		return Slot{}, false, fmt.Errorf("read replication slot: %w", database.Classify(err))
	}
	st.Lost = walStatus == "lost"
	if confirmed != nil {
		st.Confirmed = *confirmed
	}
	return st, true, nil
}
