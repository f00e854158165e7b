package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// session connects, makes sure the slot exists and can be read, and
// streams from it until ctx ends or the connection fails. streamed says
// whether it got as far as streaming.
func (s *Source) session(ctx context.Context) (streamed bool, err error) {
	cfg, err := database.Config(s.cfg.DatabaseURL, database.Limits{})
	if err != nil {
		return false, fmt.Errorf("SENDER_CDC_DATABASE_URL: %w", err)
	}
	conf := cfg.ConnConfig.Config.Copy()
	if db := s.store.Database(); conf.Database != db {
		// The slot would decode one database while the rows are claimed
		// in another: every streamed id would be meaningless.
		return false, fmt.Errorf("SENDER_CDC_DATABASE_URL names database %q, SENDER_DATABASE_URL %q: both must be Student's", conf.Database, db)
	}
	// A logical replication connection to Student's database: it takes
	// replication commands and still answers plain SQL.
	conf.RuntimeParams["replication"] = "database"
	conf.RuntimeParams["application_name"] = "outbox-sender cdc"
	// Not the server-side TCP_USER_TIMEOUT every other connection gets: a
	// reader holding back for memory (maxUnsettled) leaves the server's
	// data unacknowledged, and the server's kernel would reset the
	// connection after 15s. The server ends a reader that stops answering
	// at wal_sender_timeout instead, and the reader notices a silent server
	// by its own silenceLimit.
	conf.RuntimeParams["tcp_user_timeout"] = "0"
	cctx, cancel := context.WithTimeout(ctx, database.ConnectTimeout)
	conn, err := pgconn.ConnectConfig(cctx, conf)
	cancel()
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// Remembered so that the next session can tell this connection, should
	// it outlive the sender's hold on it, from another sender's.
	defer func(pid uint32) { s.lastPID = pid }(conn.PID())

	from, err := s.ensureSlot(ctx, conn)
	if err != nil {
		return false, err
	}
	if err := s.start(ctx, conn); err != nil {
		return false, err
	}
	s.tr.reset(from)
	s.reading.Store(true)
	s.fallback.Store(false)
	defer s.reading.Store(false)
	s.streamed = true
	s.log.Info("streaming the outbox from the replication slot", slog.String("from", from.String()))
	return true, s.stream(ctx, conn, from)
}

// start starts streaming from the slot's confirmed position. A slot held
// by this sender's own earlier connection (given up as silent, but not yet
// ended by the server, which waits wal_sender_timeout) is taken back: the
// earlier connection is ended, which its role may do. A slot held by any
// other connection is errSlotBusy.
func (s *Source) start(ctx context.Context, conn *pgconn.PgConn) error {
	for attempt := 1; ; attempt++ {
		sctx, cancel := database.WithDeadline(ctx, s.cfg.Timeout)
		// Position 0: from where the slot was last confirmed.
		err := pglogrepl.StartReplication(sctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names '" + Publication + "'"},
		})
		cancel()
		if !isCode(err, "55006") { // object_in_use: another connection streams from it
			if err != nil {
				return fmt.Errorf("start replication: %w", err)
			}
			return nil
		}
		st, ok, rerr := s.store.Slot(ctx, s.cfg.Slot)
		if rerr != nil || !ok || attempt > 1 || s.lastPID == 0 || st.ActivePID != s.lastPID {
			return errSlotBusy
		}
		s.log.Warn("the replication slot is still held by this sender's previous connection; ending it", slog.Int("pid", int(st.ActivePID)))
		tctx, cancel := database.WithDeadline(ctx, s.cfg.Timeout)
		_, err = conn.Exec(tctx, fmt.Sprintf("SELECT pg_terminate_backend(%d, 5000)", st.ActivePID)).ReadAll()
		cancel()
		if err != nil {
			return fmt.Errorf("end this sender's previous replication connection: %w", err)
		}
	}
}

// ensureSlot creates the slot if it is missing, and drops and creates it
// again if PostgreSQL invalidated it. It returns the slot's confirmed
// position, from which streaming starts.
func (s *Source) ensureSlot(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	st, ok, err := s.store.Slot(ctx, s.cfg.Slot)
	if err != nil {
		return 0, err
	}
	db := s.store.Database()
	switch {
	case ok && st.Database != db:
		return 0, fmt.Errorf("replication slot %s decodes database %q, not %q: give each Student database its own SENDER_CDC_SLOT", s.cfg.Slot, st.Database, db)
	case ok && st.Lost:
		s.fallback.Store(true)
		s.log.Error("replication slot invalidated: it held more WAL than max_slot_wal_keep_size allows, so PostgreSQL removed WAL it had not confirmed; rows since were not streamed and the poll claims them after SENDER_CDC_GRACE; dropping the slot and creating it again")
		// Dropped only if still invalidated: another sender may have
		// dropped it and made a new one meanwhile. (The config allows only
		// letters, digits and underscores in the name.)
		dctx, cancel := database.WithDeadline(ctx, s.cfg.Timeout)
		_, err := conn.Exec(dctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"+
			s.cfg.Slot+"' AND wal_status = 'lost'").ReadAll()
		cancel()
		if err != nil {
			return 0, fmt.Errorf("drop invalidated replication slot: %w", err)
		}
	case ok:
		return confirmed(st), nil
	case s.streamed:
		s.fallback.Store(true)
		s.log.Error("replication slot is gone (dropped by hand?): rows committed since its last confirmed position were not streamed, and the poll claims them after SENDER_CDC_GRACE; creating the slot again")
	}
	// Creating a slot waits for the transactions running now to end, so
	// that it decodes from a consistent point; under load that takes a
	// moment, hence the longer deadline.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	res, err := pglogrepl.CreateReplicationSlot(cctx, conn, s.cfg.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT",
	})
	cancel()
	switch {
	case isCode(err, "42710"): // duplicate_object: another sender made it just now
		st, _, err := s.store.Slot(ctx, s.cfg.Slot)
		return confirmed(st), err
	case err != nil:
		return 0, fmt.Errorf("create replication slot: %w", err)
	}
	from, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("create replication slot: consistent point %q: %w", res.ConsistentPoint, err)
	}
	s.log.Info("created the replication slot", slog.String("from", from.String()))
	if !s.streamed {
		// A first start, or a slot dropped while no sender ran: rows
		// already waiting were never announced, and wait for the poll.
		if st, err := s.store.Stats(ctx); err == nil && st.Pending > 0 {
			s.log.Warn("the new replication slot streams only rows committed from now on; the rows pending already are claimed by the poll after SENDER_CDC_GRACE",
				slog.Int64("pending", st.Pending))
		}
	}
	return from, nil
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// confirmed is the slot's confirmed position; 0 (from the start) when it
// has none yet.
func confirmed(st store.Slot) pglogrepl.LSN {
	lsn, err := pglogrepl.ParseLSN(st.Confirmed)
	if err != nil {
		return 0
	}
	return lsn
}
