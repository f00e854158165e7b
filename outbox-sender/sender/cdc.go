package sender

// The change-data-capture source (SENDER_SOURCE=cdc). Instead of asking
// the table what is new, the sender reads the outbox's inserts from
// PostgreSQL's write-ahead log, through a logical replication slot and
// pgoutput, the decoder built into PostgreSQL:
//
//	slot ──inserts──▶ reader ──ids──▶ stream claimer ──rows──▶ workers ──▶ recorders
//	                    ▲                                                     │
//	                    └──────────── confirmed position (tracker) ◀──────────┘
//
// A new row is claimed by id as soon as its transaction's commit is
// decoded, with the lease a poll's claim takes (ClaimStreamed), and from
// there it goes the way every row goes: one delivery, judgement and
// recording path for both sources. The stream says only "this row is new";
// the table stays the truth. So:
//
//   - The slot is confirmed only past transactions whose rows are all
//     settled (tracker): recorded, or found in another sender's hands. A
//     crash anywhere replays from the last confirmed position, and what is
//     replayed the claim finds settled, or Users' inbox answers again.
//   - Retries, redrives and leases that ran out go through the table: the
//     poll keeps running, but leaves new rows to the stream for
//     SENDER_CDC_GRACE. A row the stream never announced (the slot was
//     dropped, say) is claimed by the poll once it is that old.
//   - PostgreSQL lets one connection stream from a slot at a time. A second
//     cdc sender finds it busy, stands by, and tries again every second: it
//     takes over when the first dies.
//   - A slot that is dropped, or invalidated for holding too much WAL
//     (max_slot_wal_keep_size), is logged as an error; the sender polls for
//     new rows as the polling source does, and creates the slot again.
//
// The slot is created by the sender, the first time one starts in cdc mode
// (ensureSlot); the publication it reads, outbox_inserts, by Student's
// migrations (00006). The replication connection logs in as outbox_cdc,
// which has REPLICATION and no grant on any table.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// Publication is what Student's migrations publish: the outbox's inserts.
const Publication = "outbox_inserts"

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
	// standbyEvery is how often a sender that found the slot busy tries
	// to take it over.
	standbyEvery = time.Second
	// maxUnsettled bounds the streamed rows held in memory: past it the
	// reader stops reading until rows settle. A backlog then waits in the
	// slot, which holds it without limit but max_slot_wal_keep_size.
	maxUnsettled = 10_000
)

// cdc is the sender's change-data-capture source.
type cdc struct {
	s   *Sender
	log *slog.Logger
	tr  *tracker
	// reading is true while this sender streams from the slot; fallback
	// while new rows are the poll's too, because no sender can stream
	// (the slot is missing, lost, or cannot be read). Starting up, it is.
	reading, fallback atomic.Bool
	// streamed is set once this process has streamed from the slot: its
	// disappearance after that is news, not a first start.
	streamed bool
	// lastPID is the server process of this sender's last replication
	// connection.
	lastPID uint32
}

func newCDC(s *Sender) *cdc {
	c := &cdc{s: s, log: s.log.With(slog.String("slot", s.cfg.CDCSlot)), tr: newTracker()}
	c.fallback.Store(true)
	return c
}

// errSlotBusy: another connection streams from the slot.
var errSlotBusy = errors.New("another sender streams from the replication slot")

// run streams sessions until ctx ends, standing by while the slot is busy
// and reconnecting with a backoff after failures.
func (c *cdc) run(ctx context.Context) {
	failures := 0
	standing := false
	for ctx.Err() == nil {
		streamed, err := c.session(ctx)
		if ctx.Err() != nil {
			if err != nil {
				c.log.Debug("stop streaming", slog.String("error", err.Error()))
			}
			return
		}
		if streamed {
			// A stream that ended is news however long it ran; the
			// count of failures starts again.
			failures = 0
		}
		wait := standbyEvery
		switch {
		case errors.Is(err, errSlotBusy):
			// The slot is in good hands; new rows are the stream's.
			c.fallback.Store(false)
			if !standing {
				c.log.Info("another sender streams from the replication slot; standing by to take over")
			}
			standing, failures = true, 0
		default:
			standing = false
			failures++
			c.fallback.Store(true)
			wait = min(100*time.Millisecond<<min(failures, 6), 5*time.Second)
			if failures%10 == 1 {
				c.log.Error("stream the outbox from the replication slot; polling for new rows meanwhile",
					slog.Int("failures", failures), slog.String("error", err.Error()), slog.String("hint", hint(err)))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// hint says what a person can do about a failure to stream, when the
// error's code tells.
func hint(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return "Student's database may be unreachable; the sender reconnects by itself"
	}
	switch {
	case pgErr.Code == "42501" || pgErr.Code == "28000" || pgErr.Code == "28P01":
		return "the replication login was refused: check SENDER_CDC_DATABASE_URL and its password, and that outbox_cdc has REPLICATION (a superuser may run ALTER ROLE outbox_cdc REPLICATION)"
	case strings.Contains(pgErr.Message, "wal_level"):
		return "Student's database must run with wal_level=logical (a restart is needed to change it)"
	case strings.Contains(pgErr.Message, "publication"):
		return "the publication " + Publication + " is missing: run \"student migrate\""
	case strings.Contains(pgErr.Message, "max_replication_slots") || strings.Contains(pgErr.Message, "max_wal_senders"):
		return "the server has no replication slot or WAL sender free: raise max_replication_slots or max_wal_senders"
	}
	return "see the error"
}

// session connects, makes sure the slot exists and can be read, and
// streams from it until ctx ends or the connection fails. streamed says
// whether it got as far as streaming.
func (c *cdc) session(ctx context.Context) (streamed bool, err error) {
	cfg, err := database.Config(c.s.cfg.CDCDatabaseURL, database.Limits{})
	if err != nil {
		return false, fmt.Errorf("SENDER_CDC_DATABASE_URL: %w", err)
	}
	conf := cfg.ConnConfig.Config.Copy()
	if db := c.s.pool.Config().ConnConfig.Database; conf.Database != db {
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
	defer func(pid uint32) { c.lastPID = pid }(conn.PID())

	from, err := c.ensureSlot(ctx, conn)
	if err != nil {
		return false, err
	}
	if err := c.start(ctx, conn); err != nil {
		return false, err
	}
	c.tr.reset(from)
	c.reading.Store(true)
	c.fallback.Store(false)
	defer c.reading.Store(false)
	c.streamed = true
	c.log.Info("streaming the outbox from the replication slot", slog.String("from", from.String()))
	return true, c.stream(ctx, conn, from)
}

// start starts streaming from the slot's confirmed position. A slot held
// by this sender's own earlier connection (given up as silent, but not yet
// ended by the server, which waits wal_sender_timeout) is taken back: the
// earlier connection is ended, which its role may do. A slot held by any
// other connection is errSlotBusy.
func (c *cdc) start(ctx context.Context, conn *pgconn.PgConn) error {
	for attempt := 1; ; attempt++ {
		sctx, cancel := database.WithDeadline(ctx, c.s.cfg.DatabaseTimeout)
		// Position 0: from where the slot was last confirmed.
		err := pglogrepl.StartReplication(sctx, conn, c.s.cfg.CDCSlot, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names '" + Publication + "'"},
		})
		cancel()
		if !isCode(err, "55006") { // object_in_use: another connection streams from it
			if err != nil {
				return fmt.Errorf("start replication: %w", err)
			}
			return nil
		}
		st, ok, rerr := c.readSlot(ctx)
		if rerr != nil || !ok || attempt > 1 || c.lastPID == 0 || st.activePID != c.lastPID {
			return errSlotBusy
		}
		c.log.Warn("the replication slot is still held by this sender's previous connection; ending it", slog.Int("pid", int(st.activePID)))
		tctx, cancel := database.WithDeadline(ctx, c.s.cfg.DatabaseTimeout)
		_, err = conn.Exec(tctx, fmt.Sprintf("SELECT pg_terminate_backend(%d, 5000)", st.activePID)).ReadAll()
		cancel()
		if err != nil {
			return fmt.Errorf("end this sender's previous replication connection: %w", err)
		}
	}
}

// slotState is a replication slot as pg_replication_slots shows it.
type slotState struct {
	database  string // the database it decodes
	active    bool   // a connection streams from it
	activePID uint32 // the server process of that connection
	walStatus string // "lost" once invalidated
	confirmed pglogrepl.LSN
	lagBytes  float64 // WAL written since its confirmed position
	retained  float64 // WAL it keeps from being removed
}

// readSlot reads the slot's state through the sender's pool; ok is false
// when there is no slot of that name. (sqlc's catalog does not know
// pg_replication_slots, so this one query is written by hand.)
func (c *cdc) readSlot(ctx context.Context) (st slotState, ok bool, err error) {
	ctx, cancel := database.WithDeadline(ctx, c.s.cfg.DatabaseTimeout)
	defer cancel()
	var confirmed pgtype.Text
	err = c.s.pool.QueryRow(ctx, `
		SELECT database, active, COALESCE(active_pid, 0), COALESCE(wal_status, ''), confirmed_flush_lsn::text,
		       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::float8,
		       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::float8
		FROM pg_replication_slots WHERE slot_name = $1`, c.s.cfg.CDCSlot).
		Scan(&st.database, &st.active, &st.activePID, &st.walStatus, &confirmed, &st.lagBytes, &st.retained)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read replication slot: %w", err)
	}
	if confirmed.Valid {
		st.confirmed, _ = pglogrepl.ParseLSN(confirmed.String)
	}
	return st, true, nil
}

// ensureSlot creates the slot if it is missing, and drops and creates it
// again if PostgreSQL invalidated it. It returns the slot's confirmed
// position, from which streaming starts.
func (c *cdc) ensureSlot(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	st, ok, err := c.readSlot(ctx)
	if err != nil {
		return 0, err
	}
	db := c.s.pool.Config().ConnConfig.Database
	switch {
	case ok && st.database != db:
		return 0, fmt.Errorf("replication slot %s decodes database %q, not %q: give each Student database its own SENDER_CDC_SLOT", c.s.cfg.CDCSlot, st.database, db)
	case ok && st.walStatus == "lost":
		c.fallback.Store(true)
		c.log.Error("replication slot invalidated: it held more WAL than max_slot_wal_keep_size allows, so PostgreSQL removed WAL it had not confirmed; rows since were not streamed and the poll claims them after SENDER_CDC_GRACE; dropping the slot and creating it again")
		// Dropped only if still invalidated: another sender may have
		// dropped it and made a new one meanwhile. (The config allows only
		// letters, digits and underscores in the name.)
		dctx, cancel := database.WithDeadline(ctx, c.s.cfg.DatabaseTimeout)
		_, err := conn.Exec(dctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"+
			c.s.cfg.CDCSlot+"' AND wal_status = 'lost'").ReadAll()
		cancel()
		if err != nil {
			return 0, fmt.Errorf("drop invalidated replication slot: %w", err)
		}
	case ok:
		return st.confirmed, nil
	case c.streamed:
		c.fallback.Store(true)
		c.log.Error("replication slot is gone (dropped by hand?): rows committed since its last confirmed position were not streamed, and the poll claims them after SENDER_CDC_GRACE; creating the slot again")
	}
	// Creating a slot waits for the transactions running now to end, so
	// that it decodes from a consistent point; under load that takes a
	// moment, hence the longer deadline.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	res, err := pglogrepl.CreateReplicationSlot(cctx, conn, c.s.cfg.CDCSlot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT",
	})
	cancel()
	switch {
	case isCode(err, "42710"): // duplicate_object: another sender made it just now
		st, _, err := c.readSlot(ctx)
		return st.confirmed, err
	case err != nil:
		return 0, fmt.Errorf("create replication slot: %w", err)
	}
	from, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("create replication slot: consistent point %q: %w", res.ConsistentPoint, err)
	}
	c.log.Info("created the replication slot", slog.String("from", from.String()))
	if !c.streamed {
		// A first start, or a slot dropped while no sender ran: rows
		// already waiting were never announced, and wait for the poll.
		var pending int
		if err := c.s.pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE state = 'pending'").Scan(&pending); err == nil && pending > 0 {
			c.log.Warn("the new replication slot streams only rows committed from now on; the rows pending already are claimed by the poll after SENDER_CDC_GRACE",
				slog.Int("pending", pending))
		}
	}
	return from, nil
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// stream reads the slot until ctx ends or the connection fails: it hands
// each committed transaction's outbox rows to the tracker, and confirms the
// position the tracker allows.
func (c *cdc) stream(ctx context.Context, conn *pgconn.PgConn, from pglogrepl.LSN) error {
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
		pos, rows := c.tr.position()
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
		if c.tr.unsettled() >= maxUnsettled {
			select {
			case <-ctx.Done():
			case <-c.tr.freed:
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
		if pos, _ := c.tr.position(); c.tr.unsettled() == 0 && pos <= sent {
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
				c.tr.idle(ka.ServerWALEnd)
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
				c.tr.committed(m.TransactionEndLSN, m.CommitTime, open)
				c.s.metrics.cdcChanges.Add(float64(len(open)))
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

// claimStreamed claims the rows the stream announced, up to a batch at a
// time and as capacity frees, and hands them to the workers, until ctx
// ends. Rows the claim does not return are settled at once if another
// transaction holds them or they are no longer pending (settleUnclaimed).
//
// Like the poll's claimer it lets rows gather before it claims: for
// wakeLinger after a quiet spell, for claimLinger while rows stream in
// faster than one claim each. Every claim is a transaction; at 500 new
// rows a second, claiming each as it came cost about two rows a claim.
func (s *Sender) claimStreamed(ctx context.Context, tokens chan struct{}, jobs chan<- outboxdb.ClaimDueRow) {
	tr := s.cdc.tr
	failures := 0
	busy := false // the last claim took more than one row
	for {
		select {
		case <-ctx.Done():
			return
		case <-tr.ready:
		}
		for queued := tr.queued(); queued > 0 && ctx.Err() == nil; queued = tr.queued() {
			linger := wakeLinger
			if busy {
				linger = claimLinger
			}
			queued = gather(ctx, tr, s.cfg.BatchSize, linger)
			select {
			case <-ctx.Done():
				return
			case <-tokens:
			}
			n := 1 + take(tokens, min(queued, s.cfg.BatchSize)-1)
			ids := tr.take(n)
			busy = len(ids) > 1
			cctx, cancel := database.WithDeadline(context.WithoutCancel(ctx), s.cfg.DatabaseTimeout)
			rows, err := s.q.ClaimStreamed(cctx, s.pool, outboxdb.ClaimStreamedParams{
				Lease: s.cfg.Lease, ClaimedBy: pgtype.Text{String: s.cfg.ID, Valid: true}, Ids: ids, MaxAge: s.cfg.MaxAge,
			})
			cancel()
			if err != nil {
				for range n {
					tokens <- struct{}{}
				}
				// Claimed again after a backoff; if the claim did commit,
				// the second finds the rows leased and settles them.
				tr.retake(ids)
				failures++
				if failures%10 == 1 {
					s.log.Error("claim streamed outbox rows", slog.Int("failed_claims", failures), slog.String("error", err.Error()))
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(min(s.cfg.PollInterval<<min(failures, 16), 5*time.Second)):
				}
				continue
			}
			if failures > 0 {
				s.log.Info("claiming streamed rows again", slog.Int("failed_claims", failures))
			}
			failures = 0
			claimed := make(map[int64]bool, len(rows))
			for _, r := range rows {
				claimed[r.ID] = true
			}
			var others []int64
			for _, id := range ids {
				if !claimed[id] {
					others = append(others, id)
				}
			}
			invisible := s.settleUnclaimed(ctx, others)
			s.metrics.claimed.Add(float64(len(rows)))
			if len(rows) > 0 {
				s.metrics.claimSize.Observe(float64(len(rows)))
			}
			for _, r := range rows {
				jobs <- outboxdb.ClaimDueRow(r)
			}
			for range n - len(rows) {
				tokens <- struct{}{}
			}
			if invisible > 0 {
				// Their transactions show as committed a moment after
				// the stream announced them: claim them again shortly.
				time.Sleep(invisibleRetry)
			}
		}
	}
}

// gather waits up to linger for limit streamed rows to be queued, and
// returns how many are.
func gather(ctx context.Context, tr *tracker, limit int, linger time.Duration) int {
	queued := tr.queued()
	if queued >= limit {
		return queued
	}
	timer := time.NewTimer(linger)
	defer timer.Stop()
	for queued < limit {
		select {
		case <-ctx.Done():
			return queued
		case <-timer.C:
			return tr.queued()
		case <-tr.ready:
			queued = tr.queued()
		}
	}
	return queued
}

// invisibleRetry is how long the stream's claimer waits before it claims
// again rows it could not see yet; invisibleLimit is how long it keeps
// trying before it leaves such a row to the poll (a row deleted since, by
// the purge of a long-delivered row that the slot replays, is never seen).
const (
	invisibleRetry = 2 * time.Millisecond
	invisibleLimit = 5 * time.Second
)

// settleUnclaimed settles the streamed rows a claim did not return because
// they are leased, locked, delivered or dead, and puts back to be claimed
// again those the claim may simply not have seen yet: with synchronous
// commits, the stream can announce a transaction a moment before it shows
// as committed to other sessions. Settled as "held by another", such a row
// would wait for the poll, SENDER_CDC_GRACE later. It returns how many it
// put back.
//
// Whether the claim saw a row cannot be asked afterwards: a later statement
// may see it although the claim did not. So a row missed by a claim is
// looked up; if it is visible now, it is claimed once more, and only a
// claim that began after the row was seen visible, and still missed it,
// settles it.
func (s *Sender) settleUnclaimed(ctx context.Context, ids []int64) int {
	if len(ids) == 0 {
		return 0
	}
	tr := s.cdc.tr
	var settled, unsure []int64
	for _, id := range ids {
		age, followed := tr.age(id)
		if !followed || age > invisibleLimit || tr.seenVisible(id) {
			settled = append(settled, id)
		} else {
			unsure = append(unsure, id)
		}
	}
	tr.settle(settled...)
	if len(unsure) == 0 {
		return 0
	}
	cctx, cancel := database.WithDeadline(context.WithoutCancel(ctx), s.cfg.DatabaseTimeout)
	visible, err := s.q.VisibleOutboxIDs(cctx, s.pool, unsure)
	cancel()
	if err != nil {
		// Unknown: the poll is the safety net, after SENDER_CDC_GRACE.
		tr.settle(unsure...)
		return 0
	}
	tr.markVisible(visible)
	tr.retake(unsure)
	return len(unsure)
}

// leaveNew is how long the poll leaves a new row to the stream: 0 with the
// polling source, or while the stream is down.
func (s *Sender) leaveNew() time.Duration {
	if s.cdc == nil || s.cdc.fallback.Load() {
		return 0
	}
	return s.cfg.CDCGrace
}

// settled tells the stream that a batch's rows are settled: their
// answers are recorded, or, if recording failed for good, their leases
// will bring them back to the poll. Rows handed back unsent at shutdown
// are left unsettled, so the slot replays them to whichever sender reads
// it next, which claims them at once rather than after SENDER_CDC_GRACE.
func (s *Sender) settled(batch []result) {
	if s.cdc == nil {
		return
	}
	ids := make([]int64, 0, len(batch))
	for _, r := range batch {
		if r.verdict != release {
			ids = append(ids, r.row.ID)
		}
	}
	s.cdc.tr.settle(ids...)
}
