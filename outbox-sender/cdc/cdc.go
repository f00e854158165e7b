// Package cdc is the outbox sender's change-data-capture source of new rows
// (SENDER_SOURCE=cdc). Instead of asking the table what is new, it reads
// the outbox's inserts from PostgreSQL's write-ahead log, through a logical
// replication slot and pgoutput, the decoder built into PostgreSQL:
//
//	slot ──inserts──▶ reader ──ids──▶ stream feed ──rows──▶ the engine's workers ──▶ recorders
//	                    ▲                                                              │
//	                    └────────────── confirmed position (tracker) ◀─────────────────┘
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
//     source's second feed is the poll's table feed, which leaves new rows
//     to the stream for SENDER_CDC_GRACE. A row the stream never announced
//     (the slot was dropped, say) is claimed by the poll once it is that
//     old.
//   - PostgreSQL lets one connection stream from a slot at a time. A second
//     cdc sender finds it busy, stands by, and tries again every second: it
//     takes over when the first dies.
//   - A slot that is dropped, or invalidated for holding too much WAL
//     (max_slot_wal_keep_size), is logged as an error; the table feed
//     claims new rows at once meanwhile, and the slot is created again.
//
// The slot is created by the sender, the first time one starts in cdc mode
// (ensureSlot); the publication it reads, outbox_inserts, by Student's
// migrations (00006). The replication connection logs in as outbox_cdc,
// which has REPLICATION and no grant on any table.
package cdc

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/poll"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// Publication is what Student's migrations publish: the outbox's inserts.
const Publication = "outbox_inserts"

// Config is what the source needs of the sender's configuration.
type Config struct {
	DatabaseURL string        // SENDER_CDC_DATABASE_URL: Student's database as outbox_cdc
	Slot        string        // SENDER_CDC_SLOT
	Grace       time.Duration // SENDER_CDC_GRACE: how long the table leaves a new row to the stream
	Timeout     time.Duration // SENDER_DATABASE_TIMEOUT: each replication command
	PollEvery   time.Duration // SENDER_POLL_INTERVAL: the table feed's poll
	BatchSize   int           // SENDER_BATCH_SIZE: rows worth gathering for one claim
	Lease       store.Lease
}

// standbyEvery is how often a sender that found the slot busy tries to
// take it over.
const standbyEvery = time.Second

// Source is the change-data-capture source.
type Source struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	tr    *tracker
	table *poll.Table
	feed  *streamFeed
	// reading is true while this sender streams from the slot; fallback
	// while new rows are the table feed's too, because no sender can
	// stream (the slot is missing, lost, or cannot be read). Starting up,
	// it is.
	reading, fallback atomic.Bool
	// streamed is set once this process has streamed from the slot: its
	// disappearance after that is news, not a first start.
	streamed bool
	// lastPID is the server process of this sender's last replication
	// connection.
	lastPID uint32
	// changes counts the outbox inserts the slot streamed: compare with
	// student_outbox_rows_written_total.
	changes prometheus.Counter
}

// New returns the source on st, Student's database as the sender's role.
func New(log *slog.Logger, st *store.Store, cfg Config) *Source {
	s := &Source{
		cfg: cfg, log: log.With(slog.String("slot", cfg.Slot)), store: st, tr: newTracker(),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_cdc_changes_total",
			Help: "Outbox inserts this sender received from the replication slot (SENDER_SOURCE=cdc); a replay after a restart counts again.",
		}),
	}
	s.fallback.Store(true)
	s.table = poll.NewTable(st, cfg.Lease, cfg.PollEvery, nil, s.leaveNew)
	s.feed = &streamFeed{src: s}
	return s
}

// Reading says whether this sender streams from the slot now
// (outbox_cdc_reading).
func (s *Source) Reading() bool { return s.reading.Load() }

// Fallback says whether the table feed takes new rows too, because no
// sender can stream (outbox_cdc_fallback).
func (s *Source) Fallback() bool { return s.fallback.Load() }

// Feeds are the stream's announced rows, and the table for the rest.
func (s *Source) Feeds() []relay.Feed { return []relay.Feed{s.feed, s.table} }

// Settled tells the tracker, which lets the slot be confirmed past them.
func (s *Source) Settled(ids []int64) { s.tr.settle(ids...) }

// leaveNew is how long the table leaves a new row to the stream: not at
// all while no sender can stream.
func (s *Source) leaveNew() time.Duration {
	if s.fallback.Load() {
		return 0
	}
	return s.cfg.Grace
}

// errSlotBusy: another connection streams from the slot.
var errSlotBusy = errors.New("another sender streams from the replication slot")

// Run streams sessions until ctx ends, standing by while the slot is busy
// and reconnecting with a backoff after failures.
func (s *Source) Run(ctx context.Context) {
	failures := 0
	standing := false
	for ctx.Err() == nil {
		streamed, err := s.session(ctx)
		if ctx.Err() != nil {
			if err != nil {
				s.log.Debug("stop streaming", slog.String("error", err.Error()))
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
			s.fallback.Store(false)
			if !standing {
				s.log.Info("another sender streams from the replication slot; standing by to take over")
			}
			standing, failures = true, 0
		default:
			standing = false
			failures++
			s.fallback.Store(true)
			wait = min(100*time.Millisecond<<min(failures, 6), 5*time.Second)
			if failures%10 == 1 {
				s.log.Error("stream the outbox from the replication slot; polling for new rows meanwhile",
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
