//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// personBody is the body of POST /students and POST /users.
type personBody struct {
	Name           string `json:"name"`
	Email          string `json:"email"`
	DocumentNumber string `json:"document_number"`
}

// studentLoad creates students through Student's HTTP API, as a client would,
// while the scenario breaks things. Each student is created with its own
// Idempotency-Key and retried with that key until Student answers 201, so
// the client always learns whether its student exists, even when Student
// or its database fails mid-request.
type studentLoad struct {
	done chan struct{}

	mu       sync.Mutex
	acked    []uuid.UUID
	failures []string
	retries  int // repeated POSTs after an error or no answer
	replayed int // answers Student served from its own inbox
}

// loadWorkers bounds the driver's concurrency: enough to keep the outbox
// busy, few enough to leave the two cores to the system under test.
const loadWorkers = 8

// startLoad creates n students spread evenly over the given duration and
// returns at once.
func (s *scenario) startLoad(n int, over time.Duration) *studentLoad {
	prefix := fmt.Sprintf("S%s%c", s.def.id[:2], 'A'+len(s.loads))
	people := make([]personBody, n)
	for i := range people {
		people[i] = personBody{
			Name:           fmt.Sprintf("Student %s %d", prefix, i),
			Email:          fmt.Sprintf("%s-%d@example.com", strings.ToLower(prefix), i),
			DocumentNumber: fmt.Sprintf("%s-%05d", prefix, i),
		}
	}
	return s.startLoadOf(people, over)
}

func (s *scenario) startLoadOf(people []personBody, over time.Duration) *studentLoad {
	l := &studentLoad{done: make(chan struct{})}
	s.loads = append(s.loads, l)
	jobs := make(chan personBody)
	go func() {
		defer close(jobs)
		interval := over / time.Duration(len(people))
		next := time.Now()
		for _, p := range people {
			time.Sleep(time.Until(next))
			next = next.Add(interval)
			jobs <- p
		}
	}()
	var wg sync.WaitGroup
	for range min(loadWorkers, len(people)) {
		wg.Go(func() {
			for p := range jobs {
				l.create(s.client, s.studentAddr, p)
			}
		})
	}
	go func() {
		wg.Wait()
		close(l.done)
	}()
	return l
}

// create posts one student until Student gives a definite answer.
func (l *studentLoad) create(client *http.Client, addr string, p personBody) {
	key := uuid.NewString()
	body, _ := json.Marshal(p)
	deadline := time.Now().Add(2 * time.Minute)
	backoff := 50 * time.Millisecond
	var last string
	for {
		status, answer, replayed, err := postWithKey(client, "http://"+addr+"/students", key, body, asSuite...)
		switch {
		case err != nil:
			last = err.Error()
		case status == http.StatusCreated:
			var st struct {
				ID uuid.UUID `json:"id"`
			}
			if err := json.Unmarshal(answer, &st); err != nil || st.ID == uuid.Nil {
				l.fail("POST /students %s: 201 without an id: %s", p.DocumentNumber, answer)
				return
			}
			l.mu.Lock()
			l.acked = append(l.acked, st.ID)
			if replayed {
				l.replayed++
			}
			l.mu.Unlock()
			return
		case retryableAnswer(status, answer):
			last = fmt.Sprintf("%d %s", status, answer)
		default:
			l.fail("POST /students %s: %d %s", p.DocumentNumber, status, answer)
			return
		}
		if time.Now().After(deadline) {
			l.fail("POST /students %s: no answer within 2m; last: %s", p.DocumentNumber, last)
			return
		}
		l.mu.Lock()
		l.retries++
		l.mu.Unlock()
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// retryableAnswer is the client side of the idempotency protocol: a 5xx, or the
// key still being processed, means "ask again with the same key".
func retryableAnswer(status int, body []byte) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests ||
		(status == http.StatusConflict && bytes.Contains(body, []byte("/problems/idempotency-key-in-progress")))
}

// postWithKey sends one JSON POST with an Idempotency-Key, and headers
// (name, value pairs) such as Users' Authorization.
func postWithKey(client *http.Client, url, key string, body []byte, headers ...string) (status int, answer []byte, replayed bool, err error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, false, err
	}
	defer resp.Body.Close()
	answer, err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, nil, false, err
	}
	return resp.StatusCode, answer, resp.Header.Get("Idempotent-Replayed") == "true", nil
}

func (l *studentLoad) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, fmt.Sprintf(format, args...))
}

// wait waits for every student to be answered.
func (l *studentLoad) wait(timeout time.Duration) bool {
	select {
	case <-l.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (l *studentLoad) ackedIDs() []uuid.UUID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uuid.UUID(nil), l.acked...)
}
