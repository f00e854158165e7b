// Package sender is the outbox sender: it claims due outbox rows in Student's
// database, delivers each to Users with the row's idempotency key, and
// records every answer back in Student's database.
//
// The work flows through three stages so that no stage waits on another
// more than it must:
//
//	claimer ──rows──▶ workers (SENDER_CONCURRENCY) ──results──▶ recorders (4)
//
// The claimer takes due rows in batches (FOR UPDATE SKIP LOCKED, with a
// lease), workers deliver them concurrently, and the recorders record the
// answers in batches: one transaction links every student that got a user
// and marks its row delivered. Capacity tokens bound the rows in flight, so
// the sender never claims more than it can deliver within a lease.
//
// The claimer sleeps while nothing is due. A listener (wake.go) wakes it
// when Student's database notifies that rows were committed; a poll every
// SENDER_POLL_INTERVAL finds what no notification announces.
package sender

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/telemetry"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// Sender delivers outbox rows. Create it with New and call Run.
type Sender struct {
	cfg     Config
	log     *slog.Logger
	pool    *pgxpool.Pool
	q       *outboxdb.Queries
	client  *http.Client
	metrics *metrics
	// authAlarm paces the error logged when Users refuses the sender's
	// credentials: loud, but not a line per row.
	authAlarm alarm
	// cdc is the change-data-capture source (cdc.go); nil when the sender
	// polls.
	cdc *cdc
}

// New returns a Sender on Student's database (pool) delivering to
// cfg.UsersURL.
func New(log *slog.Logger, pool *pgxpool.Pool, cfg Config) *Sender {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.Concurrency
	s := &Sender{
		cfg: cfg, log: log, pool: pool, q: outboxdb.New(),
		client:  &http.Client{Transport: transport, Timeout: cfg.RequestTimeout},
		metrics: newMetrics(),
	}
	if cfg.Source == SourceCDC {
		s.cdc = newCDC(s)
	}
	return s
}

type verdict int

const (
	delivered verdict = iota // Users gave a user id: link the student
	retry                    // transient failure: try again after a backoff
	dead                     // permanent failure: dead-letter the row
	release                  // not sent (shutting down): hand the row back
)

type result struct {
	row     outboxdb.ClaimDueRow
	verdict verdict
	userID  uuid.UUID
	class   string // why it failed, for retry and dead: one of the Reason constants
	err     string
	delay   time.Duration
	status  int // Users' HTTP status; 0 when there was no answer
}

// Run delivers rows until ctx ends. Then it stops claiming, hands back the
// rows it claimed but has not sent, lets requests in flight finish (each is
// bounded by the request timeout), records their answers and returns.
func (s *Sender) Run(ctx context.Context) error {
	capacity := s.cfg.Concurrency + s.cfg.BatchSize
	tokens := make(chan struct{}, capacity)
	for range capacity {
		tokens <- struct{}{}
	}
	jobs := make(chan outboxdb.ClaimDueRow, capacity)
	results := make(chan result, capacity)

	var workers sync.WaitGroup
	for range s.cfg.Concurrency {
		workers.Go(func() {
			for row := range jobs {
				if ctx.Err() != nil {
					results <- result{row: row, verdict: release}
					continue
				}
				results <- s.attempt(ctx, row)
			}
		})
	}
	// Several recorders, so that answers do not queue behind one
	// recording transaction's round trips and commit. Their batches hold
	// different rows and never wait on each other's locks.
	var recorders sync.WaitGroup
	for range recorderCount {
		recorders.Go(func() { s.complete(ctx, results, tokens) })
	}

	// What finds new rows besides the poll. With the polling source, the
	// listener: notifications from Student's database wake the poll as
	// soon as rows commit. With the cdc source, the stream and its own
	// claimer, which claims new rows as the slot announces them, leaving
	// the poll the rows it missed and those due again (cdc.go).
	wake := make(chan struct{}, 1)
	helperDone := make(chan struct{}) // the listener, or the stream's claimer, has stopped
	streaming := make(chan struct{})
	// The stream is not stopped by ctx but after the recorders are done,
	// so that it can confirm to PostgreSQL what they settle meanwhile.
	streamCtx, stopStream := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStream()
	if s.cdc == nil {
		close(streaming)
		go func() {
			defer close(helperDone)
			s.listen(ctx, wake)
		}()
	} else {
		go func() {
			defer close(streaming)
			s.cdc.run(streamCtx)
		}()
		go func() {
			defer close(helperDone)
			s.claimStreamed(ctx, tokens, jobs)
		}()
	}

	s.claim(ctx, tokens, jobs, wake)
	<-helperDone // jobs has no sender left
	close(jobs)
	workers.Wait()
	close(results)
	recorders.Wait()
	stopStream()
	<-streaming
	s.log.Info("sender stopped")
	return nil
}

// claimLinger is how long a busy claimer waits for a batch's worth of
// free capacity before it claims with what it has. Under a backlog, slots
// free one by one as deliveries finish; claiming at every free slot would
// cost a claim query per row or two. A few milliseconds gather dozens.
const claimLinger = 10 * time.Millisecond

// recorderCount is how many recording transactions may run at once. With
// one, answers queued behind each transaction's round trips and commit:
// make bench measured p99 at 200 students/s 49 ms with one and 25 ms with
// four, and the burndown 1,206 and 1,657 linked/s.
const recorderCount = 4

// recordLinger is how long a busy recorder waits for more answers to
// share its transaction.
const recordLinger = 10 * time.Millisecond

// wakeLinger is how long the claimer waits after a notification before it
// claims, so that the commits right behind the first share its claim. It
// adds to every row's latency, so it is short: 10ms put p50 at 200
// students/s at 23 ms, 2ms at 11 ms (make bench).
const wakeLinger = 2 * time.Millisecond

// claim fills jobs with due rows while capacity tokens are free. Idle, it
// sleeps until a notification (then lingers wakeLinger for more commits to
// join) or the poll. Under a backlog it waits up to claimLinger for a
// batch's worth of free capacity.
func (s *Sender) claim(ctx context.Context, tokens chan struct{}, jobs chan<- outboxdb.ClaimDueRow, wake <-chan struct{}) {
	failures := 0    // consecutive failed claims
	backlog := false // the last claim came back full: more rows are due
	for {
		// Wait for one free slot, then take as many more as are free, up to
		// a batch: one claim query serves them all.
		select {
		case <-ctx.Done():
			return
		case <-tokens:
		}
		n := 1 + take(tokens, s.cfg.BatchSize-1)
		if backlog && n < s.cfg.BatchSize {
			linger := time.NewTimer(claimLinger)
		gather:
			for n < s.cfg.BatchSize {
				select {
				case <-tokens:
					n++
				case <-linger.C:
					break gather
				case <-ctx.Done():
					break gather
				}
			}
			linger.Stop()
			if ctx.Err() != nil {
				for range n {
					tokens <- struct{}{}
				}
				return
			}
		}
		crashpoint.Pause(crashpoint.SenderBeforeClaim)
		// Not cancelled by shutdown: a claim cut short may still have
		// committed, and rows claimed but never seen would sit out a lease.
		cctx, cancel := database.WithDeadline(context.WithoutCancel(ctx), s.cfg.DatabaseTimeout)
		rows, err := s.q.ClaimDue(cctx, s.pool, outboxdb.ClaimDueParams{
			Lease: s.cfg.Lease, ClaimedBy: pgtype.Text{String: s.cfg.ID, Valid: true}, BatchSize: int32(n), //nolint:gosec // at most SENDER_BATCH_SIZE
			MaxAge: s.cfg.MaxAge, LeaveNew: s.leaveNew(),
		})
		cancel()
		wait := s.cfg.PollInterval
		switch {
		case err == nil:
			if failures > 0 {
				s.log.Info("claiming again", slog.Int("failed_claims", failures))
			}
			failures = 0
		case ctx.Err() == nil:
			// While the database is down, back off to at most 5s between
			// tries and log the first failure and every tenth, not each.
			failures++
			wait = min(s.cfg.PollInterval<<min(failures, 16), 5*time.Second)
			if failures%10 == 1 {
				s.log.Error("claim outbox rows", slog.Int("failed_claims", failures), slog.String("error", err.Error()))
			}
		}
		s.metrics.claimed.Add(float64(len(rows)))
		if len(rows) > 0 {
			s.metrics.claimSize.Observe(float64(len(rows)))
		}
		for _, row := range rows {
			jobs <- row
		}
		for range n - len(rows) {
			tokens <- struct{}{}
		}
		backlog = err == nil && len(rows) == n
		if len(rows) < n {
			// Nothing more is due (or the database is unreachable): sleep
			// until a notification says rows were committed, or until the
			// poll, which finds what no notification announces (retries
			// coming due, rows committed while the listener reconnected).
			// A failing database is waited out by the backoff alone.
			var woken <-chan struct{}
			if err == nil {
				woken = wake
			}
			poll := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-woken:
				// Commits come in streams: a moment's wait lets the
				// next few join this claim instead of each costing one.
				// Their notifications coalesce meanwhile.
				poll.Reset(wakeLinger)
				select {
				case <-ctx.Done():
				case <-poll.C:
				}
			case <-poll.C:
			}
			poll.Stop()
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// take takes up to limit tokens that are free right now, without waiting,
// and returns how many it took.
func take(tokens chan struct{}, limit int) int {
	n := 0
	for n < limit {
		select {
		case <-tokens:
			n++
		default:
			return n
		}
	}
	return n
}

// deliver sends one row to Users and judges the answer.
func (s *Sender) deliver(ctx context.Context, row outboxdb.ClaimDueRow) (res result) {
	// One span per attempt, continuing the trace stored with the row, so
	// that retries hours apart land in the trace of the request that wrote
	// it.
	ctx, endSpan := telemetry.StartDelivery(ctx, telemetry.Delivery{
		Operation: row.Operation, OutboxID: row.ID, StudentID: row.StudentID.String(),
		IdempotencyKey: row.IdempotencyKey.String(), Attempt: int(row.Attempts), TraceParent: row.TraceParent.String,
	})
	defer func() { endSpan(res.verdict.String(), res.class, res.err) }()
	if row.Expired {
		return result{row: row, verdict: dead, class: ReasonExpired,
			err: fmt.Sprintf("gave up: the operation is older than SENDER_MAX_AGE=%s", s.cfg.MaxAge)}
	}
	// A shutdown does not cut a request short: an answer Users already
	// committed is better recorded now than found again by a redelivery.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(s.cfg.UsersURL, "/")+"/users", strings.NewReader(string(row.Payload)))
	if err != nil {
		return result{row: row, verdict: dead, class: ReasonSenderError, err: fmt.Sprintf("build request: %v", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", row.IdempotencyKey.String())
	req.Header.Set("X-Request-Id", requestID(row))
	// Users scopes the key to the caller this token names.
	req.Header.Set("Authorization", "Bearer "+string(s.cfg.UsersToken))
	telemetry.Inject(rctx, req.Header) // traceparent: Users continues the attempt's span
	// Go's Transport re-sends a request whose reused connection broke before
	// the answer, unseen, when it deems the request replayable, which the
	// Idempotency-Key header makes it (net/http: Request.isReplayable). Such
	// a send is a delivery Users receives that no attempt, no metric and no
	// log line counts. Without GetBody the body cannot be rewound, so the
	// Transport never re-sends: every send is one attempt, retried by the
	// sender's own backoff.
	req.GetBody = nil
	start := time.Now()
	defer func() { s.metrics.duration.Observe(time.Since(start).Seconds()) }()
	resp, err := s.client.Do(req)
	if err != nil {
		return s.retryOrDie(row, ReasonUsersUnreachable, fmt.Sprintf("POST /users: %v", err), 0)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return s.retryOrDie(row, ReasonUsersUnreachable, fmt.Sprintf("POST /users: read answer: %v", err), 0)
	}
	r := s.judge(ctx, row, resp, body)
	r.status = resp.StatusCode // for the delivery's log line
	return r
}

// judge classifies Users' answer. Only an answer that cannot change on a
// retry is permanent: a 2xx (with a user id, or a broken one without), or
// one of Users' own problem types about the request itself. Everything else
// is retried: no answer, 5xx, 408, 429, a key still in progress, and also
// any other 4xx, which more likely comes from a misrouted URL or a proxy
// mid-deploy than from Users, and must not dead-letter the whole outbox.
func (s *Sender) judge(ctx context.Context, row outboxdb.ClaimDueRow, resp *http.Response, body []byte) result {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		var created struct {
			UserID uuid.UUID `json:"userId"`
		}
		if err := json.Unmarshal(body, &created); err != nil || created.UserID == uuid.Nil {
			return result{row: row, verdict: dead, class: ReasonUnexpectedAnswer, err: fmt.Sprintf("Users answered %d without a userId", code)}
		}
		return result{row: row, verdict: delivered, userID: created.UserID}
	}
	var p httpapi.Problem
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == httpapi.ProblemContentType {
		_ = json.Unmarshal(body, &p)
	}
	why := fmt.Sprintf("Users answered %d %s", code, http.StatusText(code))
	if p.Title != "" {
		why = fmt.Sprintf("Users answered %d %s", code, p.Title)
	}
	switch {
	case code == http.StatusBadRequest && p.Type == httpapi.TypeValidation:
		return result{row: row, verdict: dead, class: ReasonInvalid, err: why}
	case code == http.StatusConflict && p.Type == httpapi.TypeDocumentTaken:
		return result{row: row, verdict: dead, class: ReasonRefused, err: why}
	case code == http.StatusUnprocessableEntity && p.Type == httpapi.TypeIdempotencyMismatch:
		return result{row: row, verdict: dead, class: ReasonKeyReused, err: why}
	}
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		return s.authRefused(ctx, row, code, why, s.retryAfter(resp))
	}
	class := ReasonUnexpectedAnswer
	switch {
	case code == http.StatusConflict && p.Type == httpapi.TypeIdempotencyBusy:
		class = ReasonKeyInProgress
	case code >= 500, code == http.StatusRequestTimeout, code == http.StatusTooManyRequests:
		class = ReasonUsersUnavailable
	}
	return s.retryOrDie(row, class, why, s.retryAfter(resp))
}

// authRefused judges a 401 or 403: Users, or a proxy in front of it,
// refused the sender's credentials. That says nothing about the row, whose
// request Users never looked at: every row gets the same answer until a
// person fixes SENDER_USERS_TOKEN or USERS_API_TOKENS. So the row is
// retried like any transient failure and never dead-lettered for it, not
// even by SENDER_MAX_ATTEMPTS (see retryOrDie), while the sender says so
// loudly: an error log line naming the misconfiguration, and a counter.
//
// SENDER_MAX_AGE still applies. A 401 proves that this attempt did nothing,
// not that no earlier one did: an attempt before the misconfiguration may
// have created the user and lost its answer, which Users remembers under the
// key for USERS_INBOX_RETENTION only. Retrying past the age limit could
// then create a second user.
func (s *Sender) authRefused(ctx context.Context, row outboxdb.ClaimDueRow, code int, why string, atLeast time.Duration) result {
	s.metrics.authFailures.WithLabelValues(strconv.Itoa(code)).Inc()
	if refused, ok := s.authAlarm.ring(time.Now(), authAlarmEvery); ok {
		// The token is never logged; the URL and the status say where to look.
		s.log.LogAttrs(ctx, slog.LevelError, "Users refused the sender's credentials: misconfiguration, SENDER_USERS_TOKEN is missing, wrong, or not among Users' USERS_API_TOKENS; rows are retried, not dead-lettered, until it is fixed",
			append(deliveryAttrs(row), slog.Int("status", code), slog.String("users_url", redacted(s.cfg.UsersURL)),
				slog.Int("refused_since_last_log", refused))...)
	}
	why += ": Users refused the sender's credentials (check SENDER_USERS_TOKEN)"
	return s.retryOrDie(row, ReasonUsersAuthRefused, why, atLeast)
}

// authAlarmEvery is how often, at most, the sender logs that Users refuses
// its credentials; the counter counts every refusal.
const authAlarmEvery = 10 * time.Second

// alarm paces a log line that every row could trigger at once: it rings
// for the first event and then at most once per interval, saying how many
// events there were since it last rang.
type alarm struct {
	mu     sync.Mutex
	last   time.Time
	events int
}

func (a *alarm) ring(now time.Time, every time.Duration) (events int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events++
	if !a.last.IsZero() && now.Sub(a.last) < every {
		return 0, false
	}
	events, a.events, a.last = a.events, 0, now
	return events, true
}

// retryAfter reads Retry-After in either form (seconds or an HTTP date),
// capped at BackoffMax: a server cannot push a row past the sender's own
// limits.
func (s *Sender) retryAfter(resp *http.Response) time.Duration {
	v := resp.Header.Get("Retry-After")
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.Atoi(v); err == nil {
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = time.Until(t)
	}
	return min(max(d, 0), s.cfg.BackoffMax)
}

// retryOrDie schedules another attempt with exponential backoff and jitter,
// or dead-letters the row once its attempts are used up. Refused
// credentials never use them up: the cap is a safety net for a row that
// keeps failing, and under a wrong token every row fails alike, so the cap
// would dead-letter the whole outbox over one configuration mistake.
func (s *Sender) retryOrDie(row outboxdb.ClaimDueRow, class, why string, atLeast time.Duration) result {
	if int(row.Attempts) >= s.cfg.MaxAttempts && class != ReasonUsersAuthRefused {
		return result{row: row, verdict: dead, class: ReasonAttemptsExhausted,
			err: fmt.Sprintf("gave up after %d attempts; last error (%s): %s", row.Attempts, class, why)}
	}
	return result{row: row, verdict: retry, class: class, err: why, delay: max(s.backoff(int(row.Attempts)), atLeast)}
}

// backoff doubles from BackoffMin with each attempt up to BackoffMax, then
// keeps a random half of it ("equal jitter"): senders that failed together
// spread out instead of retrying in lockstep.
func (s *Sender) backoff(attempt int) time.Duration {
	d := s.cfg.BackoffMax
	// Shift only while it cannot overflow: past that the cap applies anyway.
	if shift := max(attempt-1, 0); shift < 62 && s.cfg.BackoffMin <= s.cfg.BackoffMax>>shift {
		d = s.cfg.BackoffMin << shift
	}
	return d/2 + rand.N(d/2+1)
}

// complete records results in batches until results is closed. A batch is
// whatever has arrived by the time the previous write finished, up to
// SENDER_BATCH_SIZE, so an idle sender writes each answer at once. A busy
// one, whose last batch held more than one answer, also waits up to
// recordLinger for more: every recording transaction costs a commit, and
// answers arriving by the hundred per second share one.
func (s *Sender) complete(ctx context.Context, results <-chan result, tokens chan<- struct{}) {
	batch := make([]result, 0, s.cfg.BatchSize)
	busy := false
	for r := range results {
		var linger time.Duration
		if busy {
			linger = recordLinger
		}
		batch = fill(append(batch[:0], r), results, s.cfg.BatchSize, linger)
		busy = len(batch) > 1
		s.metrics.recordSize.Observe(float64(len(batch)))
		s.record(ctx, batch)
		s.settled(batch)
		for range batch {
			tokens <- struct{}{}
		}
	}
}

// fill adds results to batch until it holds limit, results is closed, or
// linger has passed since fill began (linger 0: only what has arrived
// already).
func fill(batch []result, results <-chan result, limit int, linger time.Duration) []result {
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
func (s *Sender) record(ctx context.Context, batch []result) {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// Recording must outlive a shutdown request: these answers are
		// already committed in Users.
		wctx, cancel := database.WithDeadline(context.WithoutCancel(ctx), s.cfg.DatabaseTimeout)
		err := s.write(wctx, batch)
		cancel()
		if err == nil {
			return
		}
		s.log.Error("record delivery results", slog.Int("rows", len(batch)), slog.Int("write_attempt", attempt), slog.String("error", err.Error()))
		if attempt == 5 || ctx.Err() != nil {
			s.log.Warn("leaving rows to their leases", slog.Int("rows", len(batch)))
			return
		}
		time.Sleep(wait)
		wait *= 2
	}
}

// write records one batch in one transaction, then counts and logs it.
func (s *Sender) write(ctx context.Context, batch []result) error {
	var (
		link     outboxdb.LinkStudentsParams
		linkRows = map[uuid.UUID]outboxdb.ClaimDueRow{}
		retries  = outboxdb.ScheduleRetriesParams{MaxAge: s.cfg.MaxAge}
		deaths   outboxdb.MarkDeadParams
		releases outboxdb.ReleaseParams
	)
	for _, r := range batch {
		switch r.verdict {
		case delivered:
			link.OutboxIds = append(link.OutboxIds, r.row.ID)
			link.StudentIds = append(link.StudentIds, r.row.StudentID)
			link.UserIds = append(link.UserIds, r.userID)
			linkRows[r.row.StudentID] = r.row
		case retry:
			retries.Ids = append(retries.Ids, r.row.ID)
			retries.LeaseTokens = append(retries.LeaseTokens, r.row.LeaseToken)
			retries.Delays = append(retries.Delays, r.delay)
			retries.Errors = append(retries.Errors, cleanError(r.err))
			retries.ReasonClasses = append(retries.ReasonClasses, r.class)
		case dead:
			deaths.Ids = append(deaths.Ids, r.row.ID)
			deaths.LeaseTokens = append(deaths.LeaseTokens, r.row.LeaseToken)
			deaths.Errors = append(deaths.Errors, cleanError(r.err))
			deaths.ReasonClasses = append(deaths.ReasonClasses, r.class)
		case release:
			releases.Ids = append(releases.Ids, r.row.ID)
			releases.LeaseTokens = append(releases.LeaseTokens, r.row.LeaseToken)
		}
	}
	if len(link.StudentIds) > 0 {
		crashpoint.Hit(crashpoint.SenderAfterResponse)
	}
	var (
		conflicts []conflict
		// applied holds the rows whose settlement this sender wrote: a
		// delivery it marked, a retry or dead-letter it wrote. A retry or
		// dead-letter whose lease another sender took over was not; nor was
		// a delivery another sender had recorded first.
		applied map[int64]bool
		// released is how many rows the sender handed back.
		released int64
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		conflicts, applied, released = nil, map[int64]bool{}, 0 // a retried transaction starts over
		if len(link.StudentIds) > 0 {
			c, err := s.link(ctx, tx, link, linkRows, &deaths, applied)
			if err != nil {
				return err
			}
			conflicts = c
		}
		if len(retries.Ids) > 0 {
			ids, err := s.q.ScheduleRetries(ctx, tx, retries)
			if err != nil {
				return fmt.Errorf("schedule retries: %w", err)
			}
			for _, id := range ids {
				applied[id] = true
			}
		}
		if len(deaths.Ids) > 0 {
			ids, err := s.q.MarkDead(ctx, tx, deaths)
			if err != nil {
				return fmt.Errorf("dead-letter rows: %w", err)
			}
			for _, id := range ids {
				applied[id] = true
			}
		}
		if len(releases.Ids) > 0 {
			n, err := s.q.Release(ctx, tx, releases)
			if err != nil {
				return fmt.Errorf("release rows: %w", err)
			}
			released = n
		}
		crashpoint.Pause(crashpoint.SenderInRecord)
		return s.recordHistory(ctx, tx, batch, conflicts, applied)
	})
	if err != nil {
		return err
	}
	// Counted only now that the answers are committed, and only what this
	// transaction applied, so that each settlement counts once across
	// senders.
	recorded := time.Now()
	conflicted := make(map[int64]conflict, len(conflicts))
	for _, c := range conflicts {
		conflicted[c.row.ID] = c
		// Logged even when another sender had settled the row meanwhile:
		// the student's link contradicts Users either way.
		s.log.LogAttrs(ctx, slog.LevelError, "student linked to a different user",
			append(deliveryAttrs(c.row), slog.String("answered_user_id", c.user.String()))...)
	}
	if released > 0 {
		s.metrics.results.WithLabelValues(release.String(), reasonLabel("")).Add(float64(released))
	}
	for _, r := range batch {
		v, class := r.verdict, r.class
		if v == release {
			continue // counted above
		}
		_, isConflict := conflicted[r.row.ID]
		if isConflict {
			v, class = dead, ReasonConflict
		}
		if !applied[r.row.ID] {
			s.log.LogAttrs(ctx, slog.LevelDebug, "answer not recorded: another sender holds or settled the row",
				append(deliveryAttrs(r.row), slog.String("verdict", v.String()))...)
			continue
		}
		s.metrics.settled(v, class, r.row, recorded)
		if v == dead && !isConflict { // a conflict has its own line, above
			s.log.LogAttrs(ctx, slog.LevelWarn, "outbox row dead-lettered",
				append(deliveryAttrs(r.row), slog.String("reason_class", class), slog.String("error", r.err))...)
		}
	}
	return nil
}

type conflict struct {
	row  outboxdb.ClaimDueRow
	user uuid.UUID // the user Users answered with
}

// link records user ids on their students and marks those rows delivered,
// in one statement; the rows it marked go into applied. A student already
// linked to a different user is never overwritten: its row is added to
// deaths with the reason (unfenced: the answer is a fact about the key, not
// the lease) and returned for logging.
func (s *Sender) link(ctx context.Context, tx pgx.Tx, link outboxdb.LinkStudentsParams,
	rows map[uuid.UUID]outboxdb.ClaimDueRow, deaths *outboxdb.MarkDeadParams, applied map[int64]bool) ([]conflict, error) {
	linked, err := s.q.LinkStudents(ctx, tx, link)
	if err != nil {
		return nil, fmt.Errorf("link students: %w", err)
	}
	done := make(map[uuid.UUID]bool, len(linked))
	for _, l := range linked {
		done[l.StudentID] = true
		if l.Marked {
			applied[rows[l.StudentID].ID] = true
		}
	}
	var conflicts []conflict
	for i, sid := range link.StudentIds {
		if done[sid] {
			continue
		}
		row := rows[sid]
		conflicts = append(conflicts, conflict{row: row, user: link.UserIds[i]})
		deaths.Ids = append(deaths.Ids, row.ID)
		deaths.LeaseTokens = append(deaths.LeaseTokens, uuid.Nil)
		deaths.Errors = append(deaths.Errors, conflictError(link.UserIds[i]))
		deaths.ReasonClasses = append(deaths.ReasonClasses, ReasonConflict)
	}
	return conflicts, nil
}

func conflictError(answered uuid.UUID) string {
	return fmt.Sprintf("student is already linked to a different user; Users answered %s", answered)
}

// historyKeep is how many events each row's history keeps.
const historyKeep = 20

// recordHistory adds an event per attempt of the batch to the rows'
// histories, in the recording transaction, trimming each history to its
// newest historyKeep events (one statement, RecordEvents). Rows handed back at shutdown were not
// attempted, and a retry or dead-letter that was not applied (the lease was
// lost to another sender) is that sender's to tell.
func (s *Sender) recordHistory(ctx context.Context, tx pgx.Tx, batch []result, conflicts []conflict, applied map[int64]bool) error {
	conflicted := make(map[int64]conflict, len(conflicts))
	for _, c := range conflicts {
		conflicted[c.row.ID] = c
	}
	ev := outboxdb.RecordEventsParams{Kind: "attempt", Actor: s.cfg.ID, Keep: historyKeep}
	for _, r := range batch {
		if r.verdict == release || (r.verdict == retry || r.verdict == dead) && !applied[r.row.ID] {
			continue
		}
		outcome, class, why := r.verdict.String(), r.class, r.err
		if c, ok := conflicted[r.row.ID]; ok {
			outcome, class, why = dead.String(), ReasonConflict, conflictError(c.user)
		}
		ev.OutboxIds = append(ev.OutboxIds, r.row.ID)
		ev.Attempts = append(ev.Attempts, r.row.Attempts)
		ev.Outcomes = append(ev.Outcomes, outcome)
		ev.ReasonClasses = append(ev.ReasonClasses, class)
		ev.Errors = append(ev.Errors, cleanError(why))
		ev.IdempotencyKeys = append(ev.IdempotencyKeys, r.row.IdempotencyKey)
	}
	if len(ev.OutboxIds) == 0 {
		return nil
	}
	if err := s.q.RecordEvents(ctx, tx, ev); err != nil {
		return fmt.Errorf("record history: %w", err)
	}
	return nil
}

// cleanError makes an error message storable: PostgreSQL text holds no NUL
// and must be valid UTF-8, and a message from a remote server is bounded, so
// that one odd answer can never make a whole batch unrecordable.
func cleanError(msg string) string {
	msg = strings.ToValidUTF8(strings.ReplaceAll(msg, "\x00", ""), "\uFFFD")
	if len(msg) > 1000 {
		msg = strings.ToValidUTF8(msg[:1000], "") + "…"
	}
	return msg
}
