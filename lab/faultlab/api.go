package faultlab

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/outboxref/outboxref/internal/httpapi"
)

//go:embed page/index.html
var page []byte

// Limits of the controls.
const (
	maxCreate     = 1000
	createWorkers = 8
	createTimeout = 10 * time.Second // one student
	// One click's students, all of them; shorter than the server's write
	// timeout, so that the page hears how many were created.
	createDeadline  = httpapi.WriteTimeout - 5*time.Second
	deadLetterPage  = 50
	upstreamTimeout = 5 * time.Second
	maxUpstreamBody = 1 << 20
)

// API is the page and the JSON routes it calls. It changes nothing but the
// proxy's faults by itself; students are created and dead letters
// redriven through Student's and the sender's own APIs, as a person with
// curl would.
type API struct {
	log      *slog.Logger
	proxy    *Proxy
	observer *Observer
	client   *http.Client
	cfg      Config
}

// Routes adds the lab's routes to r:
//
//	GET  /                                the page
//	GET  /api/state                       everything the page shows
//	POST /api/students                    {"count": N}
//	POST /api/faults/{fault}              drop-answers, cut, reject {"on": bool}; latency {"ms": N}; unavailable {"seconds": N}
//	POST /api/heal                        every fault off
//	GET  /api/dead-letters                the newest dead rows, from the sender's admin API
//	POST /api/dead-letters/{id}/redrive   redrive one with its same key
func (a *API) Routes(r chi.Router) {
	r = r.With(a.sameSite)
	r.Get("/", a.pageHandler)
	r.Get("/api/state", httpapi.Handle(func(w http.ResponseWriter, r *http.Request) error {
		return httpapi.WriteJSON(w, http.StatusOK, a.observer.State(r.Context()))
	}))
	r.Post("/api/students", httpapi.Handle(a.createHandler))
	r.Post("/api/faults/{fault}", httpapi.Handle(a.faultHandler))
	r.Post("/api/heal", httpapi.Handle(a.healHandler))
	r.Get("/api/dead-letters", httpapi.Handle(a.deadLettersHandler))
	r.Post("/api/dead-letters/{id}/redrive", httpapi.Handle(a.redriveHandler))
}

// sameSite refuses a request for a host name the lab was not told of, and
// a change sent by another site's page. The controls have no login (the
// page is for one person's machine, published on loopback only), so a
// page elsewhere must not reach them: not by a name of its own pointed at
// 127.0.0.1 (DNS rebinding: the browser would then call it same-origin),
// and not by a cross-site request the browser sends without asking.
func (a *API) sameSite(next http.Handler) http.Handler {
	hosts := httpapi.AllowHosts("LAB_ALLOWED_HOSTS", a.cfg.AllowedHosts)
	return hosts(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Header.Get("Sec-Fetch-Site") == "cross-site" {
			httpapi.Render(w, r, httpapi.NewProblem(httpapi.TypeForbidden, "the lab takes changes from its own page only"))
			return
		}
		next.ServeHTTP(w, r)
	}))
}

// The page loads nothing from elsewhere and may not be framed; its script
// and style are inline, in the one file.
const pagePolicy = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; " +
	"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (a *API) pageHandler(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", pagePolicy)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(page)
}

// decode reads a JSON body into dst. Only application/json is taken: the
// routes change state, and another site's page may send a form or plain
// text to localhost without the browser asking first, but never JSON.
func decode(w http.ResponseWriter, r *http.Request, dst any) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return httpapi.NewProblem(httpapi.TypeUnsupportedMediaType, "send the body as application/json")
	}
	return httpapi.DecodeJSON(w, r, dst)
}

// Created is the answer to POST /api/students.
type Created struct {
	Requested int      `json:"requested"`
	Created   int      `json:"created"`
	Failed    int      `json:"failed"`
	Errors    []string `json:"errors"`
}

func (a *API) createHandler(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Count *int `json:"count"`
	}
	if err := decode(w, r, &in); err != nil {
		return err
	}
	if in.Count == nil || *in.Count < 1 || *in.Count > maxCreate {
		return httpapi.Field("count", fmt.Sprintf("required: a whole number from 1 to %d", maxCreate))
	}
	return httpapi.WriteJSON(w, http.StatusOK, a.create(r.Context(), *in.Count))
}

// create posts n students to Student, a few at a time.
func (a *API) create(ctx context.Context, n int) Created {
	out := Created{Requested: n, Errors: []string{}}
	ctx, cancel := context.WithTimeout(ctx, createDeadline)
	defer cancel()
	batch := randomHex(4) // the documents of one click share a prefix
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(createWorkers, n) {
		wg.Go(func() {
			for i := range next {
				err := a.createOne(ctx, batch, i)
				mu.Lock()
				if err != nil {
					out.Failed++
					if len(out.Errors) < 3 {
						out.Errors = append(out.Errors, err.Error())
					}
				} else {
					out.Created++
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i + 1
	}
	close(next)
	wg.Wait()
	if out.Failed > 0 {
		a.log.Warn("students not created", slog.Int("failed", out.Failed), slog.Any("first_errors", out.Errors))
	}
	return out
}

func (a *API) createOne(ctx context.Context, batch string, i int) error {
	doc := fmt.Sprintf("LAB-%s-%04d", batch, i)
	body, err := json.Marshal(map[string]string{
		"name": fmt.Sprintf("Lab student %d", i), "email": fmt.Sprintf("lab-%s-%d@example.com", batch, i), "document_number": doc,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.StudentURL+"/students", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if a.cfg.StudentToken != "" {
		req.Header.Set("Authorization", "Bearer "+string(a.cfg.StudentToken))
	}
	resp, err := a.client.Do(req)
	if err != nil {
		// The cause names Student's address: the log gets it, the page
		// the gist.
		a.log.Debug("no answer from Student", slog.String("error", err.Error()))
		return errors.New("no answer from Student")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("answer %d from Student: %s", resp.StatusCode, problemDetail(resp.Body))
	}
	// Read to the end, so that the connection is reused for the next one.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxUpstreamBody))
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// problemDetail is the detail of a problem+json body, or its title.
func problemDetail(body io.Reader) string {
	var p struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	if err := json.NewDecoder(io.LimitReader(body, maxUpstreamBody)).Decode(&p); err != nil {
		return "(no problem details)"
	}
	if p.Detail != "" {
		return p.Detail
	}
	return p.Title
}

func (a *API) faultHandler(w http.ResponseWriter, r *http.Request) error {
	var (
		f   Faults
		err error
	)
	switch fault := chi.URLParam(r, "fault"); fault {
	case "drop-answers", "cut", "reject":
		var in struct {
			On *bool `json:"on"`
		}
		if err := decode(w, r, &in); err != nil {
			return err
		}
		if in.On == nil {
			return httpapi.Field("on", "required: true or false")
		}
		switch fault {
		case "drop-answers":
			f = a.proxy.SetDropAnswers(*in.On)
		case "reject":
			f = a.proxy.SetReject(*in.On)
		default:
			f, err = a.proxy.SetCut(*in.On)
		}
	case "latency":
		var in struct {
			MS *int `json:"ms"`
		}
		if err := decode(w, r, &in); err != nil {
			return err
		}
		if in.MS == nil || *in.MS < 0 || *in.MS > int(maxLatency/time.Millisecond) {
			return httpapi.Field("ms", fmt.Sprintf("required: milliseconds from 0 (off) to %d", maxLatency.Milliseconds()))
		}
		f = a.proxy.SetLatency(time.Duration(*in.MS) * time.Millisecond)
	case "unavailable":
		var in struct {
			Seconds *int `json:"seconds"`
		}
		if err := decode(w, r, &in); err != nil {
			return err
		}
		if in.Seconds == nil || *in.Seconds < 0 || *in.Seconds > int(maxUnavailable/time.Second) {
			return httpapi.Field("seconds", fmt.Sprintf("required: seconds from 0 (off) to %d", int(maxUnavailable.Seconds())))
		}
		f = a.proxy.SetUnavailable(time.Duration(*in.Seconds) * time.Second)
	default:
		return httpapi.NewProblem(httpapi.TypeNotFound,
			"no fault "+strconv.Quote(fault)+"; the faults are drop-answers, latency, cut, unavailable and reject")
	}
	if err != nil {
		return proxyFailed(err)
	}
	return httpapi.WriteJSON(w, http.StatusOK, f)
}

func (a *API) healHandler(w http.ResponseWriter, r *http.Request) error {
	var in struct{}
	if err := decode(w, r, &in); err != nil {
		return err
	}
	f, err := a.proxy.Heal()
	if err != nil {
		return proxyFailed(err)
	}
	return httpapi.WriteJSON(w, http.StatusOK, f)
}

// proxyFailed is Toxiproxy failing to change: in practice, the proxy's
// port taken by another process while it was cut. The page shows the faults
// as they now are; the log has the cause.
func proxyFailed(err error) error {
	return httpapi.Unavailable("the fault proxy could not make the change (the lab's log says why); the page shows the faults as they are", err)
}

// DeadLetter is a dead row as the page lists it.
type DeadLetter struct {
	ID          int64      `json:"id"`
	StudentID   string     `json:"student_id"`
	Key         string     `json:"key"`
	ReasonClass string     `json:"reason_class"`
	LastError   string     `json:"last_error"`
	Attempts    int        `json:"attempts"`
	DeadAt      *time.Time `json:"dead_at"`
}

// senderRow is the part of the sender's GET /outbox rows the page shows.
type senderRow struct {
	ID             int64  `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
	Student        struct {
		ID string `json:"id"`
	} `json:"student"`
	Attempts    int        `json:"attempts"`
	ReasonClass *string    `json:"reason_class"`
	LastError   *string    `json:"last_error"`
	DeadAt      *time.Time `json:"dead_at"`
}

func (a *API) deadLettersHandler(w http.ResponseWriter, r *http.Request) error {
	resp, err := a.sender(r.Context(), http.MethodGet, "/outbox?state=dead&limit="+strconv.Itoa(deadLetterPage), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return passOn(w, resp)
	}
	var page struct {
		Items []senderRow `json:"items"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxUpstreamBody)).Decode(&page); err != nil {
		return fmt.Errorf("dead letters: the sender's answer: %w", err)
	}
	out := struct {
		Items []DeadLetter `json:"items"`
	}{Items: make([]DeadLetter, 0, len(page.Items))}
	for _, row := range page.Items {
		out.Items = append(out.Items, DeadLetter{
			ID: row.ID, StudentID: row.Student.ID, Key: row.IdempotencyKey, Attempts: row.Attempts, DeadAt: row.DeadAt,
			ReasonClass: deref(row.ReasonClass), LastError: deref(row.LastError),
		})
	}
	return httpapi.WriteJSON(w, http.StatusOK, out)
}

func (a *API) redriveHandler(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	if err != nil || id < 1 || strconv.FormatInt(id, 10) != chi.URLParam(r, "id") {
		return httpapi.Field("id", "must be a positive whole number, written without sign or leading zeros")
	}
	var in struct{}
	if err := decode(w, r, &in); err != nil {
		return err
	}
	// Retry: the same key, so a user Users may have made already is found
	// in its inbox rather than made twice.
	resp, err := a.sender(r.Context(), http.MethodPost, "/outbox/"+strconv.FormatInt(id, 10)+"/redrive", []byte(`{"mode":"retry"}`))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return passOn(w, resp)
}

// sender calls the sender's admin API.
func (a *API) sender(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	//nolint:gosec // G704: the sender's address is configuration (LAB_SENDER_ADMIN_URL); path is built here
	req, err := http.NewRequestWithContext(ctx, method, a.cfg.SenderAdminURL+path, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.cfg.SenderAdminToken != "" {
		req.Header.Set("Authorization", "Bearer "+string(a.cfg.SenderAdminToken))
	}
	resp, err := a.client.Do(req) //nolint:gosec // G704: as above
	if err != nil {
		cancel()
		return nil, httpapi.Unavailable("the sender's admin API did not answer; is the sender running?", err)
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// passOn sends the sender's answer on as it came: its problems already
// say what the person can do, and its 5xx carry no details.
func passOn(w http.ResponseWriter, resp *http.Response) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
	if err != nil {
		return httpapi.Unavailable("the sender's answer was cut short", err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// joinURL is base with path appended, for the /readyz of each service.
func joinURL(base, path string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base + path
	}
	return u.JoinPath(path).String()
}
