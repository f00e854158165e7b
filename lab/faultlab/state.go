package faultlab

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/outbox"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/testkit/invariant"
)

// How fresh the page's figures are. Several open pages share one reading
// of the databases within stateMaxAge; a reading or a readiness check that
// takes longer than its timeout is reported on the page as unreadable.
const (
	stateMaxAge  = 250 * time.Millisecond
	readTimeout  = 2 * time.Second
	checkTimeout = 500 * time.Millisecond
	maxProblems  = 5
)

// State is GET /api/state: everything the page shows.
type State struct {
	Time       time.Time         `json:"time"`
	Known      bool              `json:"known"` // false until the databases have been read once: no figure is a verdict yet
	Hops       []Hop             `json:"hops"`
	Counts     Counts            `json:"counts"`
	Checker    []invariant.Check `json:"checker"`
	Problems   []string          `json:"problems"`
	Faults     Faults            `json:"faults"`
	Proxy      Counters          `json:"proxy"`
	Deliveries []Delivery        `json:"deliveries"`
	Errors     []string          `json:"errors"`

	read time.Time // when the figures were read from the databases
}

// Hop is one box of the flow diagram.
type Hop struct {
	Name   string `json:"name"`
	Label  string `json:"label"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Counts are the page's figures, all read from the two databases.
type Counts struct {
	Students     StudentCounts `json:"students"`
	Outbox       OutboxCounts  `json:"outbox"`
	Attempts     int           `json:"attempts"`
	Redeliveries int           `json:"redeliveries"`
	Users        int           `json:"users"`
	// OwnUsers are the users made under the sender's keys: once the
	// outbox is drained, as many as there are students. Foreign ones were
	// made by other callers (an operator with curl).
	OwnUsers int `json:"own_users"`
	Foreign  int `json:"foreign_users"`
	Inbox    int `json:"inbox"`
	Replays  int `json:"replays"`
}

// StudentCounts are the students by the checker's verdict: failed are the
// dead-lettered ones.
type StudentCounts struct {
	Total   int `json:"total"`
	Pending int `json:"pending"`
	Linked  int `json:"linked"`
	Failed  int `json:"failed"`
}

// OutboxCounts are the create-user outbox rows by state. Pending counts
// every row on its way (drift.InFlight), the page's "in flight": those
// waiting to be sent, and with the broker transport those whose command
// the broker holds while Users' answer is awaited, which Published counts
// again apart.
type OutboxCounts struct {
	Pending   int `json:"pending"`
	Published int `json:"published"`
	Delivered int `json:"delivered"`
	Dead      int `json:"dead"`
}

// Observer reads the system for the page: both databases through the
// read-only lab_reader, each service's /readyz, and the proxy's own state.
type Observer struct {
	log            *slog.Logger
	student, users *pgxpool.Pool
	proxy          *Proxy
	client         *http.Client
	ready          map[string]string // hop name → its /readyz URL
	caller         string            // the sender's caller name at Users

	mu   sync.Mutex
	last State
}

// NewObserver returns an Observer; ready maps "student", "sender" and
// "users" to their /readyz URLs, and caller is the sender's caller name at
// Users (see invariant.Input.Caller).
func NewObserver(log *slog.Logger, student, users *pgxpool.Pool, proxy *Proxy, ready map[string]string, caller string) *Observer {
	return &Observer{
		log: log, student: student, users: users, proxy: proxy, ready: ready, caller: caller,
		client: &http.Client{Timeout: checkTimeout},
	}
}

// State returns the current state. The databases and the services are
// read afresh unless another request read them within stateMaxAge:
// requests queue on the mutex, so pages that poll never make the lab read
// the databases more than once at a time. The proxy's own figures are
// always current.
func (o *Observer) State(ctx context.Context) State {
	o.mu.Lock()
	defer o.mu.Unlock()
	if time.Since(o.last.Time) >= stateMaxAge {
		// The reading is shared by every request queued behind this one, so
		// this request's going away must not cut it short; readTimeout and
		// checkTimeout bound it.
		o.last = o.read(context.WithoutCancel(ctx))
	}
	st := o.last
	st.Faults, st.Proxy, st.Deliveries = o.proxy.Faults(), o.proxy.Counters(), o.proxy.Timeline()
	lab := Hop{Name: "lab", Label: "lab (fault proxy)", OK: !st.Faults.Any(), Detail: st.Faults.describe()}
	st.Hops = slices.Clone(st.Hops)
	st.Hops[3] = lab
	return st
}

// read reads the databases and asks the services whether they are ready.
func (o *Observer) read(ctx context.Context) State {
	st := State{Problems: []string{}, Errors: []string{}}
	ready := o.checkReady(ctx)

	readCtx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	rows, in, err := invariant.LoadLive(readCtx, o.student, o.users)
	in.Caller = o.caller
	if err != nil {
		// The cause may name hosts; the page gets the gist, the log the
		// rest. The figures stay those of the last reading, and say so:
		// zeros would claim a verdict nobody reached.
		o.log.Warn("cannot read the databases", slog.String("error", err.Error()))
		st.Counts, st.Checker, st.Problems, st.Known = o.last.Counts, o.last.Checker, o.last.Problems, o.last.Known
		since := "never read"
		if !o.last.read.IsZero() {
			since = "as read at " + o.last.read.Format("15:04:05") + " UTC"
		}
		st.read = o.last.read
		st.Errors = append(st.Errors, "cannot read the databases (the lab's log says why); the figures are "+since)
	} else {
		rep := invariant.Classify(rows, in)
		st.read, st.Known = time.Now().UTC(), true
		st.Counts = count(rows, rep)
		st.Checker = rep.Checks()
		st.Problems = rep.Problems[:min(len(rep.Problems), maxProblems)]
	}
	if st.Checker == nil {
		st.Checker = invariant.Report{}.Checks()
	}

	outbox := Hop{Name: "outbox", Label: "outbox", OK: err == nil, Detail: "unreadable"}
	if err == nil {
		outbox.Detail = fmt.Sprintf("%d in flight, %d dead", st.Counts.Outbox.Pending, st.Counts.Outbox.Dead)
		if p := st.Counts.Outbox.Published; p > 0 {
			outbox.Detail = fmt.Sprintf("%d in flight (%d published, awaiting Users), %d dead", st.Counts.Outbox.Pending, p, st.Counts.Outbox.Dead)
		}
	}
	st.Hops = []Hop{ready["student"], outbox, ready["sender"], {}, ready["users"]} // State fills in the lab
	for _, h := range st.Hops {
		if !h.OK && h.Detail == "not answering" {
			st.Errors = append(st.Errors, h.Label+" is not answering")
		}
	}
	// Stamped when the reading is done: its age counts from the moment its
	// figures are as new as they will be.
	st.Time = time.Now().UTC()
	return st
}

func count(rows invariant.State, rep invariant.Report) Counts {
	c := Counts{
		Students: StudentCounts{Total: rep.Students, Pending: rep.Pending, Linked: rep.Linked, Failed: rep.Dead},
		Users:    len(rows.Users), OwnUsers: len(rows.Users) - rep.Foreign, Foreign: rep.Foreign,
		Inbox: len(rows.Inbox), Replays: rep.Replays, Redeliveries: rep.Redeliveries,
	}
	for _, o := range rows.Outbox {
		c.Attempts += o.Attempts
		switch {
		case drift.InFlight(o.State):
			// Pending or, with the broker transport, published: on its way.
			c.Outbox.Pending++
			if o.State == outbox.StatePublished {
				c.Outbox.Published++
			}
		case o.State == outbox.StateDelivered:
			c.Outbox.Delivered++
		case o.State == outbox.StateDead:
			c.Outbox.Dead++
		}
	}
	return c
}

// hopLabels are the diagram's names for the services it asks.
var hopLabels = map[string]string{"student": "Student", "sender": "outbox-sender", "users": "Users"}

// checkReady asks each service's /readyz, all at once.
func (o *Observer) checkReady(ctx context.Context) map[string]Hop {
	out := make(map[string]Hop, len(o.ready))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, url := range o.ready {
		wg.Go(func() {
			h := Hop{Name: name, Label: hopLabels[name], Detail: o.askReady(ctx, url)}
			h.OK = h.Detail == "ready"
			mu.Lock()
			out[name] = h
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func (o *Observer) askReady(ctx context.Context, url string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return "not answering"
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return "not answering"
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Up, but its database is not: /readyz answers 503.
		return "not ready"
	}
	return "ready"
}
