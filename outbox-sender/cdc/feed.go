package cdc

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// streamFeed is the rows the stream announced, waiting to be claimed by id.
// The engine's claim loop calls Wait and Claim from one goroutine.
type streamFeed struct {
	src *Source
	// invisible is set when the last claim put back rows it could not see
	// yet: the next Wait gives them a moment.
	invisible bool
}

func (f *streamFeed) String() string { return "stream" }

// Wait blocks until the stream has announced rows, then lets more gather
// before they are claimed: for relay.WakeLinger after a quiet spell, for
// relay.BusyLinger while rows stream in faster than one claim each. Every
// claim is a transaction; at 500 new rows a second, claiming each as it
// came cost about two rows a claim.
func (f *streamFeed) Wait(ctx context.Context, last relay.Claimed) int {
	tr := f.src.tr
	if f.invisible {
		// Their transactions show as committed a moment after the stream
		// announced them: claim them again shortly.
		f.invisible = false
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(invisibleRetry):
		}
	}
	for tr.queued() == 0 {
		select {
		case <-ctx.Done():
			return 0
		case <-tr.ready:
		}
	}
	linger := relay.WakeLinger
	if last.Asked > 1 {
		linger = relay.BusyLinger
	}
	return gather(ctx, tr, f.src.cfg.BatchSize, linger)
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

// Claim claims up to n of the announced rows by id. Rows the claim does
// not return are settled at once if another transaction holds them or they
// are no longer pending (settleUnclaimed). Rows of a failed claim are put
// back, to be claimed again after the claim loop's backoff (if the claim
// did commit, the second finds them leased and settles them), until they
// are older than unclaimableLimit (leaveUnclaimable).
func (f *streamFeed) Claim(ctx context.Context, n int) ([]store.Row, error) {
	tr := f.src.tr
	ids := tr.take(n)
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := f.src.store.ClaimIDs(ctx, f.src.cfg.Lease, ids)
	if err != nil {
		tr.retake(f.leaveUnclaimable(ids))
		return nil, err
	}
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
	f.invisible = f.settleUnclaimed(ctx, others) > 0
	return rows, nil
}

// unclaimableLimit is how long the stream feed keeps trying to claim a
// streamed row while its claims fail, before it leaves the row to the
// table feed.
const unclaimableLimit = 5 * time.Second

// leaveUnclaimable settles the rows of a failed claim that the stream
// delivered more than unclaimableLimit ago, and returns the others, to be
// claimed again. The table feed claims a settled row once it is
// SENDER_CDC_GRACE old, so nothing is lost; what this prevents is a reader
// that can never confirm. A server shutting down (pg_ctl stop -m fast)
// ends every session and refuses new ones, then waits for each logical
// reader to confirm all it was sent before it exits: rows nobody can claim
// any more would hold that shutdown for ever.
func (f *streamFeed) leaveUnclaimable(ids []int64) []int64 {
	tr := f.src.tr
	var stale, retry []int64
	for _, id := range ids {
		if age, followed := tr.age(id); followed && age > unclaimableLimit {
			stale = append(stale, id)
		} else {
			retry = append(retry, id)
		}
	}
	if len(stale) > 0 {
		tr.settle(stale...)
		f.src.log.Warn("streamed rows could not be claimed for "+unclaimableLimit.String()+"; the poll claims them after SENDER_CDC_GRACE",
			slog.Int("rows", len(stale)))
	}
	return retry
}

// invisibleRetry is how long the stream feed waits before it claims again
// rows it could not see yet; invisibleLimit is how long it keeps trying
// before it leaves such a row to the table (a row deleted since, by the
// purge of a long-delivered row that the slot replays, is never seen).
const (
	invisibleRetry = 2 * time.Millisecond
	invisibleLimit = 5 * time.Second
)

// settleUnclaimed settles the streamed rows a claim did not return because
// they are leased, locked, delivered or dead, and puts back to be claimed
// again those the claim may simply not have seen yet: with synchronous
// commits, the stream can announce a transaction a moment before it shows
// as committed to other sessions. Settled as "held by another", such a row
// would wait for the table feed, SENDER_CDC_GRACE later. It returns how
// many it put back.
//
// Whether the claim saw a row cannot be asked afterwards: a later statement
// may see it although the claim did not. So a row missed by a claim is
// looked up; if it is visible now, it is claimed once more, and only a
// claim that began after the row was seen visible, and still missed it,
// settles it.
func (f *streamFeed) settleUnclaimed(ctx context.Context, ids []int64) int {
	if len(ids) == 0 {
		return 0
	}
	tr := f.src.tr
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
	visible, err := f.src.store.VisibleIDs(ctx, unsure)
	if err != nil {
		// Unknown: the table feed is the safety net, after
		// SENDER_CDC_GRACE.
		tr.settle(unsure...)
		return 0
	}
	tr.markVisible(visible)
	tr.retake(unsure)
	return len(unsure)
}
