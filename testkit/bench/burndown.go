package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
)

// The sender's and Users' shipped defaults that shape the delivery bound
// (outbox-sender/sender/config.go, services/users/usersvc/config.go).
const (
	senderBatchSize    = 100                   // SENDER_BATCH_SIZE
	senderConcurrency  = 32                    // SENDER_CONCURRENCY
	senderLease        = 30 * time.Second      // SENDER_LEASE
	senderMaxAge       = 72 * time.Hour        // SENDER_MAX_AGE
	senderDBTimeout    = 3 * time.Second       // SENDER_DATABASE_TIMEOUT
	senderHistoryKeep  = 20                    // store.HistoryKeep (outbox-sender/internal/store)
	senderRecordLinger = 10 * time.Millisecond // recordLinger in outbox-sender/relay
	senderRecorders    = 4                     // recorderCount in outbox-sender/relay
	senderCaller       = "outbox-sender"       // the sender's caller name in Users
	usersKeyWait       = 2 * time.Second       // USERS_IDEMPOTENCY_WAIT
	usersTimeout       = 4 * time.Second       // USERS_DATABASE_TIMEOUT
)

// seedChunk is how many students one of seed's statements writes.
const seedChunk = 5000

// seed writes rows students, each with its create-user outbox row, as
// Student writes them: a UUIDv7 id, the payload {name, email,
// document_number}, a fresh idempotency key, due now. In chunks, so that a
// large backlog is not one huge statement.
func seed(ctx context.Context, pool *pgxpool.Pool, rows int) error {
	for from := 0; from < rows; from += seedChunk {
		n := min(seedChunk, rows-from)
		ids := make([]uuid.UUID, n)
		names, emails, docs := make([]string, n), make([]string, n), make([]string, n)
		for i := range n {
			p := newStudent(int64(from + i + 1))
			ids[i], names[i], emails[i], docs[i] = uuid.Must(uuid.NewV7()), p.Name, p.Email, p.DocumentNumber
		}
		if _, err := pool.Exec(ctx, `
			WITH s AS (
				INSERT INTO students (id, name, email, document_number)
				SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[])
				RETURNING id, name, email, document_number)
			INSERT INTO outbox (idempotency_key, operation, student_id, payload)
			SELECT gen_random_uuid(), 'create-user', id,
			       jsonb_build_object('name', name, 'email', email, 'document_number', document_number)
			FROM s`, ids, names, emails, docs); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	return nil
}

// linkedCount is how many students have their user id.
func linkedCount(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, "SELECT count(*) FROM students WHERE user_id IS NOT NULL").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count linked: %w", err)
	}
	return n, nil
}

// waitLinked polls every 50ms until want students are linked, and returns
// when that was seen. alive is checked on the way, so a crashed process
// fails the wait at once rather than at the deadline.
func waitLinked(ctx context.Context, pool *pgxpool.Pool, want int, deadline time.Duration, alive func() error) (time.Time, error) {
	until := time.Now().Add(deadline)
	for {
		n, err := linkedCount(ctx, pool)
		if err != nil {
			return time.Time{}, err
		}
		if n >= want {
			return time.Now(), nil
		}
		if err := alive(); err != nil {
			return time.Time{}, err
		}
		if time.Now().After(until) {
			return time.Time{}, fmt.Errorf("only %d of %d students linked after %s", n, want, deadline)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// verifyLinked checks the end state: every student linked, each to its own
// user, and Users holding exactly one user per student. "Its own" is
// checked pair by pair: each student's (user id, document number) must be
// a user's (id, document number) in Users, compared as one digest of all
// pairs on each side, so that swapped or invented links fail too.
func verifyLinked(ctx context.Context, d *databases, want int) error {
	var students, linked, distinct, users int
	var studentPairs, userPairs string
	if err := d.studentAdmin.QueryRow(ctx, `
		SELECT count(*), count(user_id), count(DISTINCT user_id),
		       COALESCE(md5(string_agg(user_id::text || ':' || document_number, ',' ORDER BY user_id, document_number)), '')
		FROM students`).Scan(&students, &linked, &distinct, &studentPairs); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if err := d.usersAdmin.QueryRow(ctx, `
		SELECT count(*), COALESCE(md5(string_agg(id::text || ':' || document_number, ',' ORDER BY id, document_number)), '')
		FROM users`).Scan(&users, &userPairs); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if students != want || linked != want || distinct != want || users != want {
		return fmt.Errorf("verify: %d students, %d linked, %d distinct user ids, %d users; want %d of each",
			students, linked, distinct, users, want)
	}
	if studentPairs != userPairs {
		return errors.New("verify: the students' (user id, document number) pairs differ from Users' (id, document number): some student is linked to another student's user")
	}
	return nil
}

// burndownReal seeds a backlog, starts Users and then the sender with
// shipped defaults and SENDER_SOURCE=source, and returns students linked
// per second from the sender's start until the last student is linked.
//
// Both sources meet the same scene: a sender that was down while the
// backlog piled up, then starts. For cdc that scene needs a slot that
// existed before the backlog: a slot starts at the WAL's position when it
// is created, and rows committed earlier are not streamed but left to the
// poll until they are SENDER_CDC_GRACE old, which would measure the grace,
// not the stream. So the cdc sender is started first, until it streams
// from its new slot, and stopped; the backlog is seeded while it is down,
// and the slot holds it, as it would a deployment's during an outage; and
// the clock starts as the sender is started again. It then reads the
// backlog from the WAL (the seed's transactions of seedChunk rows), and its
// poll claims whatever is older than the grace by then, as it would.
//
// cpu is the whole system's CPU per row (Users, the sender and PostgreSQL's
// processes, from the sender's start to the last link; b.cpuSince), -1
// when not measured; work is what PostgreSQL did per row (statements,
// commits and WAL; work.go), from just before the sender's start until
// the services have stopped.
func (b *bench) burndownReal(ctx context.Context, rows int, source string) (rate float64, cpu time.Duration, work dbWork, err error) {
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return 0, 0, dbWork{}, err
	}
	defer b.drop(d)
	if source != sourceCDC {
		if err := seed(ctx, d.studentAdmin, rows); err != nil {
			return 0, 0, dbWork{}, err
		}
	}
	sys, err := b.start(ctx, d, which{users: true, source: source}, nil)
	if err != nil {
		return 0, 0, dbWork{}, err
	}
	defer sys.stop()
	if source == sourceCDC {
		if err := sys.launch(ctx, senderBin); err != nil {
			return 0, 0, dbWork{}, err
		}
		if err := sys.waitStreaming(ctx); err != nil {
			return 0, 0, dbWork{}, err
		}
		b.procs.stop(sys.sender)
		sys.sender = nil
		if err := seed(ctx, d.studentAdmin, rows); err != nil {
			return 0, 0, dbWork{}, err
		}
	}
	// The work is counted from here, after the seed: Users' start-up
	// before this is a handful of statements.
	workDone, err := b.workSince(ctx, d)
	if err != nil {
		return 0, 0, dbWork{}, err
	}
	// The clock starts as the sender is started: its start-up is part of
	// burning the backlog down.
	start := time.Now()
	if err := sys.launch(ctx, senderBin); err != nil {
		return 0, 0, dbWork{}, err
	}
	// From just after the launch: the sender's own start-up before this
	// is a few milliseconds of CPU against seconds of burndown.
	spent, err := b.cpuSince(ctx, sys)
	if err != nil {
		return 0, 0, dbWork{}, err
	}
	end, err := waitLinked(ctx, d.studentAdmin, rows, 10*time.Minute, sys.alive)
	if err != nil {
		return 0, 0, dbWork{}, err
	}
	use, err := spent()
	if err != nil {
		return 0, 0, dbWork{}, err
	}
	// The services stop before the count ends: their sessions' commits
	// reach the statistics as the sessions end.
	sys.stop()
	if work, err = workDone(ctx, rows); err != nil {
		return 0, 0, dbWork{}, err
	}
	if err := verifyLinked(ctx, d, rows); err != nil {
		return 0, 0, dbWork{}, err
	}
	cpu = -1
	if total := use.total(); total >= 0 {
		cpu = total / time.Duration(rows)
	}
	return float64(rows) / end.Sub(start).Seconds(), cpu, work, nil
}

// burndownBound does the sender's and Users' database work for the same
// backlog with SQL only, as the default sender does it: one claimer taking
// batches of SENDER_BATCH_SIZE with the sender's ClaimDue (as
// outbox_sender); SENDER_CONCURRENCY workers each running Users'
// create-user transaction for a row (internal/inbox's Do: the key with its
// answer and InsertUser, one batch; as users_app, on Users' database); and four
// recorders writing the answers as the sender does (LinkStudents, which
// also marks the rows delivered, and RecordEvents, which also trims the
// histories, in one transaction, a batch being
// whatever arrived meanwhile and, while busy, within recordLinger, up to
// SENDER_BATCH_SIZE). Its claims always take a whole batch. Not in it: HTTP,
// JSON over the wire, authentication, and the process boundaries; and
// nothing waits for a poll, since every row is due from the start.
func (b *bench) burndownBound(ctx context.Context, rows int) (float64, error) {
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return 0, err
	}
	defer b.drop(d)
	if err := seed(ctx, d.studentAdmin, rows); err != nil {
		return 0, err
	}
	// The claimer and the recorders hold a connection each, within the
	// sender's default pool (SENDER_DB_MAX_CONNS, 8); the workers stand for
	// SENDER_CONCURRENCY requests in Users, a connection each.
	studentPool, err := b.rolePool(ctx, d.student, migrations.OutboxSender, 8, senderDBTimeout)
	if err != nil {
		return 0, err
	}
	defer studentPool.Close()
	usersPool, err := b.rolePool(ctx, d.users, migrations.UsersApp, senderConcurrency, usersTimeout)
	if err != nil {
		return 0, err
	}
	defer usersPool.Close()

	start := time.Now()
	if err := b.deliverAll(ctx, studentPool, usersPool, rows); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	if err := verifyLinked(ctx, d, rows); err != nil {
		return 0, err
	}
	return float64(rows) / elapsed.Seconds(), nil
}

type claimed struct {
	id             int64
	attempts       int32
	key, studentID uuid.UUID
	payload        []byte
}

type answered struct {
	claimed
	userID uuid.UUID
}

// deliverAll runs the bound's three stages until rows rows are recorded.
func (b *bench) deliverAll(ctx context.Context, studentPool, usersPool *pgxpool.Pool, rows int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan claimed, senderBatchSize)
	results := make(chan answered, senderConcurrency+senderBatchSize)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(jobs)
		if err := b.claimAll(ctx, studentPool, jobs); err != nil {
			cancel(err)
		}
	})
	var workers sync.WaitGroup
	ib := inbox.New(usersPool)
	ib.LockTimeout, ib.Timeout = usersKeyWait, usersTimeout
	for range senderConcurrency {
		workers.Go(func() {
			for row := range jobs {
				userID, err := b.createUser(ctx, ib, row)
				if err != nil {
					cancel(err)
					continue // drain, so the claimer never blocks
				}
				results <- answered{claimed: row, userID: userID}
			}
		})
	}
	wg.Go(func() {
		workers.Wait()
		close(results)
	})
	// As many recorders as the sender runs (recorderCount in outbox-sender/relay).
	var (
		recorded  atomic.Int64
		recorders sync.WaitGroup
	)
	for range senderRecorders {
		recorders.Go(func() {
			batch := make([]answered, 0, senderBatchSize)
			busy := false
			for r := range results {
				// As the sender's recorder: what has arrived, and while
				// busy up to recordLinger more (outbox-sender/relay, complete).
				batch = append(batch[:0], r)
				var linger <-chan time.Time
				if busy {
					linger = time.After(senderRecordLinger)
				}
			fill:
				for len(batch) < senderBatchSize {
					select {
					case r, ok := <-results:
						if !ok {
							break fill
						}
						batch = append(batch, r)
						continue
					default:
					}
					if linger == nil {
						break
					}
					select {
					case r, ok := <-results:
						if !ok {
							break fill
						}
						batch = append(batch, r)
					case <-linger:
						break fill
					}
				}
				busy = len(batch) > 1
				if ctx.Err() != nil {
					continue // drain
				}
				if err := b.record(ctx, studentPool, batch); err != nil {
					cancel(err)
					continue
				}
				recorded.Add(int64(len(batch)))
			}
		})
	}
	recorders.Wait()
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if n := recorded.Load(); n != int64(rows) {
		return fmt.Errorf("bound: recorded %d of %d rows", n, rows)
	}
	return nil
}

// claimAll claims due rows in batches until none is left: every seeded row
// is due at once, so an empty claim means all are claimed.
func (b *bench) claimAll(ctx context.Context, pool *pgxpool.Pool, jobs chan<- claimed) error {
	q := b.q["ClaimDue"]
	args, err := q.args(map[string]any{
		"lease": senderLease, "claimed_by": "bench-bound", "batch_size": int32(senderBatchSize), "max_age": senderMaxAge,
	})
	if err != nil {
		return err
	}
	for {
		// As the sender's store runs it: the setting and the claim in one
		// batch, one implicit transaction whose commit does not wait for
		// the flush.
		cctx, cancel := database.WithDeadline(ctx, senderDBTimeout)
		sent := &pgx.Batch{}
		sent.Queue("SELECT set_config('synchronous_commit', 'off', true)")
		sent.Queue(q.sql, args...)
		results := pool.SendBatch(cctx, sent)
		rows, err := claimRows(results)
		if err != nil {
			cancel()
			return fmt.Errorf("claim: %w", err)
		}
		var batch []claimed
		for rows.Next() {
			var (
				c         claimed
				operation string
				lease     uuid.UUID
				createdAt time.Time
				trace     *string // the sender continues it; the bound has no traces
				expired   bool
				expiresAt time.Time // only the broker form sends it
				// The broker form's last publish: never, for the bound.
				publishedSeq int64
				publishes    int32
				publishedAgo time.Duration
			)
			if err := rows.Scan(&c.id, &c.key, &operation, &c.studentID, &c.payload, &c.attempts, &lease, &createdAt, &trace, &expired, &expiresAt,
				&publishedSeq, &publishes, &publishedAgo); err != nil {
				rows.Close()
				_ = results.Close()
				cancel()
				return fmt.Errorf("claim: %w", err)
			}
			batch = append(batch, c)
		}
		rows.Close()
		err = errors.Join(rows.Err(), results.Close())
		cancel()
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		if len(batch) == 0 {
			return nil
		}
		for _, c := range batch {
			select {
			case jobs <- c:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// claimRows skips the batch's setting and returns the claim's rows; on an
// error it closes the batch.
func claimRows(results pgx.BatchResults) (pgx.Rows, error) {
	if _, err := results.Exec(); err != nil {
		return nil, errors.Join(err, results.Close())
	}
	rows, err := results.Query() //nolint:rowserrcheck // claimAll reads the rows and their Err
	if err != nil {
		return nil, errors.Join(err, results.Close())
	}
	return rows, nil
}

// createUser is Users' transaction for one delivery: the payload decoded
// as Users decodes the body, then the key with its answer and the user in
// one batch (inbox.Do), as Users does.
func (b *bench) createUser(ctx context.Context, ib *inbox.Inbox, row claimed) (uuid.UUID, error) {
	var p person.Person
	if err := json.Unmarshal(row.payload, &p); err != nil {
		return uuid.Nil, fmt.Errorf("bound: payload: %w", err)
	}
	q := b.q["InsertUser"]
	id := uuid.Must(uuid.NewV7())
	args, err := q.args(map[string]any{"id": id, "name": p.Name, "email": p.Email, "document_number": p.DocumentNumber})
	if err != nil {
		return uuid.Nil, err
	}
	insert := &pgx.Batch{}
	insert.Queue(q.sql, args...)
	// Users stores its 201 body under the key.
	body, err := json.Marshal(struct {
		UserID uuid.UUID `json:"userId"`
		Status string    `json:"status"`
	}{id, "created"})
	if err != nil {
		return uuid.Nil, fmt.Errorf("answer: %w", err)
	}
	out, _, err := ib.Do(ctx, inbox.Key{Caller: senderCaller, Value: row.key.String()}, p.Fields(),
		inbox.Op{Outcome: inbox.Outcome{Status: 201, Body: body, ResourceID: id}, Effect: insert})
	if err != nil {
		return uuid.Nil, fmt.Errorf("bound: create user: %w", err)
	}
	return out.ResourceID, nil
}

// record writes one batch of answers as the sender's store.Record does
// for deliveries: in one pgx batch, one implicit transaction bounded by
// SENDER_DATABASE_TIMEOUT, link the students and mark their rows delivered
// (one statement), then add an attempt event per row and trim each row's
// history (one statement).
func (b *bench) record(ctx context.Context, pool *pgxpool.Pool, batch []answered) error {
	var (
		studentIDs, userIDs, keys []uuid.UUID
		outboxIDs                 []int64
		attempts                  []int32
		outcomes, classes, errs   []string
	)
	for _, r := range batch {
		studentIDs = append(studentIDs, r.studentID)
		userIDs = append(userIDs, r.userID)
		outboxIDs = append(outboxIDs, r.id)
		attempts = append(attempts, r.attempts)
		outcomes = append(outcomes, "delivered")
		classes = append(classes, "")
		// The sender sends, with each delivery, the error its conflict
		// would have (store.ConflictError); the bound sends as much.
		errs = append(errs, "student is already linked to a different user; Users answered "+r.userID.String())
		keys = append(keys, r.key)
	}
	link, events := b.q["LinkStudents"], b.q["RecordEvents"]
	ctx, cancel := database.WithDeadline(ctx, senderDBTimeout)
	defer cancel()
	linkArgs, err := link.args(map[string]any{
		"outbox_ids": outboxIDs, "student_ids": studentIDs, "user_ids": userIDs, "conflict_errors": errs,
	})
	if err != nil {
		return err
	}
	eventArgs, err := events.args(map[string]any{
		"outbox_ids": outboxIDs, "keep": int32(senderHistoryKeep), "kind": "attempt", "actor": "bench-bound", "attempts": attempts,
		"outcomes": outcomes, "reason_classes": classes, "errors": errs, "idempotency_keys": keys,
	})
	if err != nil {
		return err
	}
	// One batch, one implicit transaction, as the sender records.
	batchQ := &pgx.Batch{}
	batchQ.Queue(link.sql, linkArgs...)
	batchQ.Queue(events.sql, eventArgs...)
	br := pool.SendBatch(ctx, batchQ)
	defer br.Close()
	// Each row: the answer's outbox row, whether its student was linked,
	// and whether this statement settled the row.
	rows, _ := br.Query()
	settled, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (bool, error) {
		var (
			id             int64
			linked, marked bool
		)
		err := row.Scan(&id, &linked, &marked)
		return linked && marked, err
	})
	if err != nil {
		return fmt.Errorf("link students: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("record history and commit: %w", err)
	}
	if n := len(settled); n != len(batch) || slices.Contains(settled, false) {
		return fmt.Errorf("link students: %d answers, not all linked and marked delivered", n)
	}
	return nil
}
