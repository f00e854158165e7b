package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/person"
)

// Student's shipped defaults that shape its transaction
// (services/student/studentsvc/config.go): STUDENT_IDEMPOTENCY_WAIT, the
// transaction's lock_timeout, and STUDENT_DATABASE_TIMEOUT, its deadline and
// the server's statement_timeout.
const (
	studentKeyWait = 5 * time.Second
	studentTimeout = 8 * time.Second
	// The bound's pool is Student's (STUDENT_DB_MAX_CONNS): the clients'
	// transactions wait for a connection in both, and more connections than
	// cores measured no faster here.
	studentDBMaxConns = 16
)

// intakeConfig is how intake is driven: clients POSTing back to back.
type intakeConfig struct {
	clients          int
	warmup, duration time.Duration
}

// closedLoop runs clients workers that each call do back to back, for
// warm-up and then the measured duration, and returns the completions per
// second of the measured part. Work still in flight when time is up is
// finished, not counted. The first error stops everything and is returned.
func closedLoop(ctx context.Context, cfg intakeConfig, do func(ctx context.Context, n int64) error) (float64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		seq, done atomic.Int64
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	for range cfg.clients {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				if err := do(ctx, seq.Add(1)); err != nil {
					cancel(err)
					return
				}
				done.Add(1)
			}
		})
	}
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	sleep(cfg.warmup)
	start, from := time.Now(), done.Load()
	sleep(cfg.duration)
	elapsed, to := time.Since(start), done.Load()
	stop.Store(true)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	return float64(to-from) / elapsed.Seconds(), nil
}

// newStudent is the n-th student of a run: unique document number, valid
// by Student's rules.
func newStudent(n int64) person.Person {
	return person.Person{
		Name:           fmt.Sprintf("Student %d", n),
		Email:          fmt.Sprintf("student%d@example.com", n),
		DocumentNumber: fmt.Sprintf("doc-%d", n),
	}
}

// httpClient is a keep-alive client holding up to conns connections to
// one host.
func httpClient(conns int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = conns
	t.MaxIdleConnsPerHost = conns
	// No more than that open either: past a quarter of Student's
	// STUDENT_HTTP_MAX_CONNS (1,024) from one address, each new connection
	// closes one of the client's idle ones (httpapi.LimitConns), and a
	// request the client sends on it meanwhile fails with EOF. Requests
	// past the cap wait for a connection, and the wait counts in their
	// latency, which runs from the scheduled send.
	t.MaxConnsPerHost = conns
	return &http.Client{Transport: t, Timeout: 30 * time.Second}
}

// The bench's caller of Student's API (STUDENT_API_TOKENS).
const (
	clientCaller = "bench"
	clientToken  = "bench-client-token-0123456789"
)

// postStudent POSTs p to Student as the README's curl session does:
// JSON, no Idempotency-Key (a key is optional on POST /students, and the
// README's example sends none). Anything but a 201 is an error carrying
// the answer.
func postStudent(ctx context.Context, client *http.Client, base string, p person.Person) (uuid.UUID, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return uuid.Nil, fmt.Errorf("post student: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/students", bytes.NewReader(body))
	if err != nil {
		return uuid.Nil, fmt.Errorf("post student: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+clientToken)
	resp, err := client.Do(req)
	if err != nil {
		return uuid.Nil, fmt.Errorf("post student: %w", err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return uuid.Nil, fmt.Errorf("post student: read answer: %w", err)
	}
	if resp.StatusCode != http.StatusCreated {
		return uuid.Nil, fmt.Errorf("post student: Student answered %s: %s", resp.Status, answer)
	}
	var created struct {
		ID uuid.UUID `json:"id"`
	}
	if err := json.Unmarshal(answer, &created); err != nil || created.ID == uuid.Nil {
		return uuid.Nil, fmt.Errorf("post student: a 201 without an id: %s", answer)
	}
	return created.ID, nil
}

// intakeReal measures Student alone (no sender, no Users): students/s that
// POST /students creates with cfg.clients keep-alive clients.
func (b *bench) intakeReal(ctx context.Context, cfg intakeConfig) (float64, error) {
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return 0, err
	}
	defer b.drop(d)
	sys, err := b.start(ctx, d, which{student: true}, nil)
	if err != nil {
		return 0, err
	}
	defer sys.stop()
	client := httpClient(cfg.clients)
	defer client.CloseIdleConnections()
	rate, err := closedLoop(ctx, cfg, func(ctx context.Context, n int64) error {
		_, err := postStudent(ctx, client, sys.studentURL(), newStudent(n))
		return err
	})
	if err != nil {
		return 0, errors.Join(err, sys.alive())
	}
	return rate, sys.alive()
}

// intakeBound measures the database alone doing Student's work: the
// transaction Student runs for POST /students without a key, from
// cfg.clients Go workers sharing a pool of Student's size, as student_app. It is
// Student's own statement (db/queries/student), committed on its own, as
// Student's store runs it, with the same payload. Not in it: HTTP, JSON decoding and validation, the answer's
// encoding, and the Student process.
func (b *bench) intakeBound(ctx context.Context, cfg intakeConfig) (float64, error) {
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return 0, err
	}
	defer b.drop(d)
	pool, err := b.rolePool(ctx, d.student, migrations.StudentApp, studentDBMaxConns, studentTimeout)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	insert := b.q["InsertStudentWithOutbox"]
	return closedLoop(ctx, cfg, func(ctx context.Context, n int64) error {
		p := newStudent(n)
		payload, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("outbox payload: %w", err)
		}
		args, err := insert.args(map[string]any{
			"id": uuid.Must(uuid.NewV7()), "name": p.Name, "email": p.Email, "document_number": p.DocumentNumber,
			"created_at": time.Now().UTC(), "idempotency_key": uuid.New(), "operation": "create-user", "payload": payload,
			"trace_parent": "", // the bound runs untraced, as the shipped defaults do
		})
		if err != nil {
			return err
		}
		// Student's keyless create: its one statement, committed on its own.
		ctx, cancel := database.WithDeadline(ctx, studentTimeout)
		defer cancel()
		if _, err := pool.Exec(ctx, insert.sql, args...); err != nil {
			return fmt.Errorf("insert student and outbox row: %w", err)
		}
		return nil
	})
}
