package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxref/outboxref/internal/crashpoint"
)

const (
	// confirmEvery is how long the reader waits for a message before it
	// looks whether settled rows let it confirm further. The slot's lag
	// in bytes moves in steps of about this.
	confirmEvery = 100 * time.Millisecond
	// heartbeatEvery is the longest the reader stays silent: the server
	// ends a replication connection silent for wal_sender_timeout (60s by
	// default, 15s in docker-compose.yml). Each heartbeat asks the server
	// to answer at once.
	heartbeatEvery = 5 * time.Second
	// silenceLimit is how long the reader waits for any message, having
	// asked for one with each heartbeat, before it gives the connection
	// up. A frozen connection (a proxy or a host that stopped answering
	// without closing) would otherwise look like a quiet outbox for ever:
	// TCP's own timeouts do not help when something between the two ends
	// keeps acknowledging.
	silenceLimit = 3 * heartbeatEvery
	// maxUnsettled bounds the streamed rows held in memory: past it the
	// reader stops reading until rows settle. A backlog then waits in the
	// slot, which holds it without limit but max_slot_wal_keep_size.
	maxUnsettled = 10_000
)

// stream reads the slot until ctx ends or the connection fails: it hands
// each committed transaction's outbox rows to the tracker, and confirms the
// position the tracker allows.
func (s *Source) stream(ctx context.Context, conn *pgconn.PgConn, from pglogrepl.LSN) error {
	idColumn := map[uint32]int{} // relation id → position of its id column
	var (
		open      []int64 // the rows of the transaction being received
		inTxn     bool
		sent      = from // the position last confirmed to the server
		sentRows  int64  // the tracker's row count at that position
		lastWrite = time.Now()
		lastHeard = time.Now() // the last message from the server
	)
	// confirm tells the server how far the slot may move, at most once a
	// confirmEvery unless it is a heartbeat, which also asks for an answer.
	confirm := func(heartbeat bool) error {
		pos, rows := s.tr.position()
		if !heartbeat && (pos <= sent || time.Since(lastWrite) < confirmEvery) {
			return nil
		}
		if rows > sentRows {
			// Answers are recorded; the server does not know yet.
			crashpoint.Hit(crashpoint.SenderBeforeConfirm)
		}
		if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: max(pos, sent), ReplyRequested: heartbeat,
		}); err != nil {
			return fmt.Errorf("confirm position: %w", err)
		}
		sent, sentRows, lastWrite = max(pos, sent), rows, time.Now()
		return nil
	}
	for {
		if ctx.Err() != nil {
			// Shutting down: what was settled meanwhile is confirmed now,
			// so that the next start replays less.
			return confirm(true)
		}
		if err := confirm(time.Since(lastWrite) >= heartbeatEvery); err != nil {
			return err
		}
		if s.tr.unsettled() >= maxUnsettled {
			select {
			case <-ctx.Done():
			case <-s.tr.freed:
			case <-time.After(confirmEvery):
			}
			// Not reading, the reader hears nothing, and that says
			// nothing about the connection.
			lastHeard = time.Now()
			continue
		}
		if silent := time.Since(lastHeard); silent > silenceLimit {
			return fmt.Errorf("receive: the server sent nothing for %s although asked to answer; the connection is given up", silent.Round(time.Second))
		}
		// While rows are unsettled, look every confirmEvery whether the
		// slot can move; with none, sleep until a message or the next
		// heartbeat: an idle sender should cost next to nothing.
		wait := confirmEvery
		if pos, _ := s.tr.position(); s.tr.unsettled() == 0 && pos <= sent {
			wait = max(heartbeatEvery-time.Since(lastWrite), confirmEvery)
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil || pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive: %w", err)
		}
		lastHeard = time.Now()
		var data []byte
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("keepalive: %w", err)
			}
			if !inTxn {
				s.tr.idle(ka.ServerWALEnd)
			}
			if ka.ReplyRequested {
				if err := confirm(true); err != nil {
					return err
				}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("WAL data: %w", err)
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return fmt.Errorf("decode pgoutput message: %w", err)
			}
			switch m := m.(type) {
			case *pglogrepl.RelationMessage:
				i := slices.IndexFunc(m.Columns, func(col *pglogrepl.RelationMessageColumn) bool { return col.Name == "id" })
				if i < 0 {
					return fmt.Errorf("published table %s.%s has no id column", m.Namespace, m.RelationName)
				}
				idColumn[m.RelationID] = i
			case *pglogrepl.BeginMessage:
				open, inTxn = open[:0], true
			case *pglogrepl.InsertMessage:
				id, err := insertedID(m, idColumn)
				if err != nil {
					return err
				}
				open = append(open, id)
			case *pglogrepl.CommitMessage:
				s.tr.committed(m.TransactionEndLSN, m.CommitTime, open)
				s.changes.Add(float64(len(open)))
				open, inTxn = nil, false
			}
		}
	}
}

// insertedID is the outbox id in an insert message.
func insertedID(m *pglogrepl.InsertMessage, idColumn map[uint32]int) (int64, error) {
	i, ok := idColumn[m.RelationID]
	if !ok {
		return 0, fmt.Errorf("insert into relation %d before its description", m.RelationID)
	}
	if m.Tuple == nil || i >= len(m.Tuple.Columns) || m.Tuple.Columns[i].DataType != pglogrepl.TupleDataTypeText {
		return 0, errors.New("insert without a text id column")
	}
	id, err := strconv.ParseInt(string(m.Tuple.Columns[i].Data), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("insert with id %q: %w", m.Tuple.Columns[i].Data, err)
	}
	return id, nil
}
