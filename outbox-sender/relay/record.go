package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// recordLinger is how long a busy recorder waits for more answers to
// share its transaction.
const recordLinger = 10 * time.Millisecond

// complete records results in batches until results is closed. A batch is
// whatever has arrived by the time the previous write finished, up to
// SENDER_BATCH_SIZE, so an idle sender writes each answer at once. A busy
// one, whose last batch held more than one answer, also waits up to
// recordLinger for more: every recording transaction costs a commit, and
// answers arriving by the hundred per second share one.
func (e *Engine) complete(ctx context.Context, results <-chan store.Result, tokens chan<- struct{}) {
	batch := make([]store.Result, 0, e.cfg.BatchSize)
	busy := false
	for r := range results {
		var linger time.Duration
		if busy {
			linger = recordLinger
		}
		batch = fill(append(batch[:0], r), results, e.cfg.BatchSize, linger)
		busy = len(batch) > 1
		e.metrics.recordSize.Observe(float64(len(batch)))
		e.record(ctx, batch)
		e.settled(batch)
		for range batch {
			tokens <- struct{}{}
		}
	}
}

// fill adds results to batch until it holds limit, results is closed, or
// linger has passed since fill began (linger 0: only what has arrived
// already).
func fill(batch []store.Result, results <-chan store.Result, limit int, linger time.Duration) []store.Result {
	var timeout <-chan time.Time
	if linger > 0 {
		t := time.NewTimer(linger)
		defer t.Stop()
		timeout = t.C
	}
	for len(batch) < limit {
		select {
		case r, ok := <-results:
			if !ok {
				return batch
			}
			batch = append(batch, r)
			continue
		default:
		}
		if timeout == nil {
			return batch
		}
		select {
		case r, ok := <-results:
			if !ok {
				return batch
			}
			batch = append(batch, r)
		case <-timeout:
			return batch
		}
	}
	return batch
}

// record writes a batch of results, retrying while Student's database is
// unreachable. If it still cannot, the rows stay pending and their leases
// run out, so they are delivered again and Users replays the same answers:
// nothing is lost, at the price of a redelivery.
func (e *Engine) record(ctx context.Context, batch []store.Result) {
	for _, r := range batch {
		if r.Outcome == delivered {
			crashpoint.Hit(crashpoint.SenderAfterResponse)
			break
		}
	}
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// Recording must outlive a shutdown request: these answers are
		// already committed in Users.
		rec, err := e.store.Record(context.WithoutCancel(ctx), e.cfg.Lease, batch)
		if err == nil {
			e.recorded(ctx, batch, rec)
			return
		}
		e.log.Error("record delivery results", slog.Int("rows", len(batch)), slog.Int("write_attempt", attempt), slog.String("error", err.Error()))
		if attempt == 5 || ctx.Err() != nil {
			e.log.Warn("leaving rows to their leases", slog.Int("rows", len(batch)))
			return
		}
		time.Sleep(wait)
		wait *= 2
	}
}

// recorded counts and logs a batch once its transaction committed, and only
// what this transaction applied, so that across senders each settlement
// counts once.
func (e *Engine) recorded(ctx context.Context, batch []store.Result, rec store.Recorded) {
	at := time.Now()
	if rec.Released > 0 {
		e.metrics.results.WithLabelValues(released, reasonLabel("")).Add(float64(rec.Released))
	}
	for _, r := range batch {
		outcome, class := r.Outcome, r.Class
		if outcome == released {
			continue // counted above
		}
		user, conflict := rec.Conflicts[r.Row.ID]
		if conflict {
			// Logged even when another sender had settled the row
			// meanwhile: the student's link contradicts Users either way.
			e.log.LogAttrs(ctx, slog.LevelError, "student linked to a different user",
				append(RowAttrs(r.Row), slog.String("answered_user_id", user.String()))...)
			outcome, class = dead, outbox.ReasonConflict
		}
		if !rec.Applied[r.Row.ID] {
			e.log.LogAttrs(ctx, slog.LevelDebug, "answer not recorded: another sender holds or settled the row",
				append(RowAttrs(r.Row), slog.String("verdict", outcome))...)
			continue
		}
		e.metrics.settled(outcome, class, r.Row, at)
		if outcome == dead && !conflict { // a conflict has its own line, above
			e.log.LogAttrs(ctx, slog.LevelWarn, "outbox row dead-lettered",
				append(RowAttrs(r.Row), slog.String("reason_class", class), slog.String("error", r.Error))...)
		}
	}
}

// settled tells the source that a batch's rows are settled: their answers
// are recorded, or, if recording failed for good, their leases will bring
// them back to the table. Rows handed back unsent at shutdown are not;
// rows handed back because their lease ran out are: the table carries
// them again (due now; with change data capture, the table's claim takes
// them after SENDER_CDC_GRACE, as it does any row not yet tried).
func (e *Engine) settled(batch []store.Result) {
	ids := make([]int64, 0, len(batch))
	for _, r := range batch {
		if r.Outcome != released || r.Lapsed {
			ids = append(ids, r.Row.ID)
		}
	}
	e.source.Settled(ids)
}
