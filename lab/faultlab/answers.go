package faultlab

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxref/outboxref/internal/httpapi"
)

// The answer faults: each request that reached them is answered in Users'
// place, or forwarded to Users and its answer seen on the way back.

// serve is the answer faults: each request is answered in Users' place,
// or forwarded to Users.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	d := Delivery{Key: r.Header.Get("Idempotency-Key"), Attempt: attemptOf(r.Header.Get("X-Request-Id"))}
	p.mu.Lock()
	p.counters.Requests++
	p.seen[d.Key]++
	d.Nth = p.seen[d.Key]
	f := p.faultsLocked()
	// A key Users has acted on is answered from its inbox, never refused:
	// a refusal in Users' place would dead-letter a row whose user exists,
	// which real Users cannot do. Such a request passes.
	reject := f.Reject && !p.acted[d.Key]
	switch {
	case f.UnavailableSecondsLeft > 0:
		p.counters.Unavailable++
	case reject:
		p.counters.Rejected++
	}
	p.mu.Unlock()

	switch {
	case f.UnavailableSecondsLeft > 0:
		d.Status, d.Fault = http.StatusServiceUnavailable, faultUnavailable
		p.record(d)
		httpapi.Render(w, r, httpapi.Unavailable("answered by the fault lab in Users' place: Users was not asked", nil))
	case reject:
		d.Status, d.Fault = http.StatusBadRequest, faultRejected
		p.record(d)
		httpapi.Render(w, r, httpapi.NewProblem(httpapi.TypeValidation, "refused by the fault lab in Users' place: Users was not asked"))
	default:
		// The reverse proxy's hooks fill in the answer and record it.
		p.pass.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), deliveryKey{}, &d)))
	}
}

type deliveryKey struct{}

// answered sees Users' answer before the sender does, and throws it away
// while answers are dropped: Users has committed, the sender never hears.
func (p *Proxy) answered(resp *http.Response) error {
	d, _ := resp.Request.Context().Value(deliveryKey{}).(*Delivery)
	if d == nil {
		return nil
	}
	d.Status = resp.StatusCode
	d.Replayed = resp.Header.Get(httpapi.ReplayedHeader) == "true"
	p.mu.Lock()
	if resp.StatusCode/100 == 2 {
		p.rememberLocked(d.Key)
	}
	drop, latency := p.dropAnswers, p.latency
	if drop {
		p.counters.Dropped++
	}
	p.mu.Unlock()
	if drop {
		d.Fault = faultDropped
		return errDropped
	}
	if latency > 0 {
		d.Delayed = true
		// The sender may give up meanwhile (its request timeout): its
		// connection closes, the request's context ends, and failed
		// records the answer as abandoned.
		t := time.NewTimer(latency - latency/10 + rand.N(latency/5+1))
		defer t.Stop()
		select {
		case <-t.C:
		case <-resp.Request.Context().Done():
			return resp.Request.Context().Err()
		}
	}
	p.record(*d)
	return nil
}

// rememberLocked adds key to the keys Users acted on, forgetting the
// oldest beyond rememberedKeys.
func (p *Proxy) rememberLocked(key string) {
	if key == "" || p.acted[key] {
		return
	}
	if len(p.actedOrder) < rememberedKeys {
		p.actedOrder = append(p.actedOrder, key)
	} else {
		delete(p.acted, p.actedOrder[p.actedNext])
		p.actedOrder[p.actedNext] = key
		p.actedNext = (p.actedNext + 1) % rememberedKeys
	}
	p.acted[key] = true
}

// failed handles an answer thrown away, a request its sender gave up on,
// and Users not answering at all.
func (p *Proxy) failed(w http.ResponseWriter, r *http.Request, err error) {
	d, _ := r.Context().Value(deliveryKey{}).(*Delivery)
	if d == nil {
		d = &Delivery{}
	}
	if r.Context().Err() != nil && !errors.Is(err, errDropped) {
		// The sender hung up (its timeout) or the cut closed the
		// connection: nobody is waiting for an answer, and Users may or may
		// not have acted. Not Users' failure, so not a warning. Its key is
		// remembered as acted on: if Users did act, a refusal in Users'
		// place would dead-letter a row whose user exists; if it did not,
		// letting the key through costs nothing.
		d.Fault = faultAbandoned
		p.mu.Lock()
		p.rememberLocked(d.Key)
		p.mu.Unlock()
		p.record(*d)
		p.log.Debug("request abandoned before Users answered", slog.String("key", d.Key), slog.String("error", err.Error()))
		return
	}
	if errors.Is(err, errDropped) {
		// The status stays Users' own, the one the sender never got.
		p.record(*d)
		// No answer at all: the connection closes under the sender, as when
		// a network drops it after Users has done the work.
		if conn, _, herr := http.NewResponseController(w).Hijack(); herr == nil {
			_ = conn.Close()
			return
		}
		panic(http.ErrAbortHandler) // closes the connection without an answer
	}
	// Users did not answer: the sender gets 502, as from any gateway.
	d.Status = http.StatusBadGateway
	p.record(*d)
	p.log.Warn("Users did not answer the fault proxy", slog.String("error", err.Error()))
	w.Header().Set("Content-Type", httpapi.ProblemContentType)
	w.WriteHeader(http.StatusBadGateway)
	_, _ = w.Write([]byte(`{"type":"about:blank","title":"Bad Gateway","status":502,"detail":"Users did not answer the fault lab"}`))
}

// attemptOf reads the attempt from the sender's X-Request-Id, "key/attempt".
func attemptOf(requestID string) int {
	_, n, ok := strings.Cut(requestID, "/")
	if !ok {
		return 0
	}
	a, err := strconv.Atoi(n)
	if err != nil || a < 0 {
		return 0
	}
	return a
}
