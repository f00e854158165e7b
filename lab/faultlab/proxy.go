package faultlab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/outboxref/outboxref/internal/httpapi"
)

// The path from the sender to Users, through the lab:
//
//	sender ──► Toxiproxy (LAB_PROXY_ADDR) ──► answer faults (127.0.0.1) ──► Users
//
// Toxiproxy breaks the connection itself: it cuts, closing the connections
// and refusing new ones. Faults that need to understand HTTP live in a
// small reverse proxy behind it: answering 503 or 400 in Users' place,
// holding Users' answer back (latency), and dropping it after Users has
// done the work. That proxy also records each delivery for the timeline.
// Latency lives there rather than in a Toxiproxy toxic so that the
// timeline can tell an answer the sender waited for from one it gave up
// on: a toxic delays bytes the proxy has already handed over.

// timelineSize is how many deliveries the page shows.
const timelineSize = 50

// rememberedKeys bounds the keys the proxy remembers Users acting on (see
// Proxy.acted): about a megabyte, far more than the lab's backlogs.
const rememberedKeys = 20000

// Limits of the controls: enough to show each effect, not enough to wedge
// the system for an afternoon.
const (
	maxLatency     = 10 * time.Second
	maxUnavailable = 10 * time.Minute
)

// Faults is what is broken right now, as the page shows it.
type Faults struct {
	DropAnswers            bool `json:"drop_answers"`
	LatencyMS              int  `json:"latency_ms"`
	Cut                    bool `json:"cut"`
	UnavailableSecondsLeft int  `json:"unavailable_seconds_left"`
	Reject                 bool `json:"reject"`
}

// Any says whether any fault is on.
func (f Faults) Any() bool {
	return f.DropAnswers || f.LatencyMS > 0 || f.Cut || f.UnavailableSecondsLeft > 0 || f.Reject
}

// describe says in a few words what is broken, for the lab's box in the
// diagram and the log.
func (f Faults) describe() string {
	var on []string
	if f.Cut {
		on = append(on, "connection cut")
	}
	if f.DropAnswers {
		on = append(on, "dropping answers")
	}
	if f.LatencyMS > 0 {
		on = append(on, fmt.Sprintf("+%d ms latency", f.LatencyMS))
	}
	if f.UnavailableSecondsLeft > 0 {
		on = append(on, fmt.Sprintf("503 for %d s more", f.UnavailableSecondsLeft))
	}
	if f.Reject {
		on = append(on, "refusing as invalid")
	}
	if len(on) == 0 {
		return "passing everything through"
	}
	return strings.Join(on, ", ")
}

// Delivery is one request that reached the answer faults, as the timeline
// shows it.
type Delivery struct {
	Time    time.Time `json:"time"` // when the answer went, or was dropped
	Key     string    `json:"key"`
	Attempt int       `json:"attempt"` // from the sender's X-Request-Id (key/attempt); 0 if absent
	// Nth is how many requests with this key the lab has seen, this one
	// included. Unlike Attempt it never starts again: a redrive counts the
	// sender's attempts afresh under the same key.
	Nth      int    `json:"nth"`
	Status   int    `json:"status"`   // Users' answer (dropped or not), or the lab's in Users' place
	Replayed bool   `json:"replayed"` // Users answered from its inbox
	Delayed  bool   `json:"delayed"`  // Users' answer was held back (latency)
	Fault    string `json:"fault"`    // "", "dropped", "unavailable", "rejected" or "abandoned"
}

// Counters count the requests that reached the answer faults, and what
// the faults did to them.
type Counters struct {
	Requests    int64 `json:"requests"`
	Dropped     int64 `json:"dropped"`
	Unavailable int64 `json:"unavailable"`
	Rejected    int64 `json:"rejected"`
}

// Fault names in the timeline.
const (
	faultDropped     = "dropped"
	faultUnavailable = "unavailable"
	faultRejected    = "rejected"
	faultAbandoned   = "abandoned" // the sender hung up, or the cut closed the connection
)

// Proxy is the fault proxy: Toxiproxy in front, the answer faults behind.
type Proxy struct {
	log   *slog.Logger
	toxi  *toxiproxy.Proxy
	inner *http.Server
	pass  *httputil.ReverseProxy

	mu               sync.Mutex
	dropAnswers      bool
	latency          time.Duration
	cut              bool
	unavailableUntil time.Time
	reject           bool
	stopped          bool
	counters         Counters
	timeline         []Delivery // a ring, newest at next-1
	next             int
	acted            map[string]bool // keys Users answered 2xx for
	seen             map[string]int  // requests by key, for Delivery.Nth
	actedOrder       []string        // acted's keys, a ring, oldest at actedNext
	actedNext        int
	now              func() time.Time
}

// errDropped makes the reverse proxy throw Users' answer away.
var errDropped = errors.New("answer dropped by the fault lab")

// NewProxy readies the proxy to users; Run starts it.
func NewProxy(ctx context.Context, log *slog.Logger, listen string, users *url.URL) (*Proxy, error) {
	p := &Proxy{log: log, now: time.Now, timeline: make([]Delivery, 0, timelineSize), acted: map[string]bool{}, seen: map[string]int{}}
	p.pass = &httputil.ReverseProxy{
		Rewrite:        func(pr *httputil.ProxyRequest) { pr.SetURL(users) },
		ModifyResponse: p.answered,
		ErrorHandler:   p.failed,
	}
	p.inner = httpapi.NewServer(http.HandlerFunc(p.serve))

	// The answer faults listen on loopback only: the sender reaches them
	// through Toxiproxy, never directly.
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	// Toxiproxy logs with zerolog; its lines would not match ours, and what
	// it would report (a connection it could not make to the answer
	// faults, on loopback) the answer faults report themselves.
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p.toxi = toxiproxy.NewProxy(server, "users", listen, ln.Addr().String())
	go func() { _ = p.inner.Serve(ln) }()
	return p, nil
}

// Run starts Toxiproxy's listener and serves until ctx ends. Starting and
// stopping hold the lock that cut and heal hold, so a cut clicked while
// the lab starts or stops finds Toxiproxy in a known state.
func (p *Proxy) Run(ctx context.Context) error {
	p.mu.Lock()
	var err error
	if !p.cut { // a cut clicked before Run listens at the heal
		err = p.toxi.Start()
	}
	addr := p.toxi.Listen // Start rewrites it with the port it got
	p.mu.Unlock()
	if err != nil {
		_ = p.inner.Close()
		return fmt.Errorf("listen: %w", err)
	}
	p.log.Info("fault proxy listening", slog.String("addr", addr))
	<-ctx.Done()
	p.mu.Lock()
	p.toxi.Stop()
	p.stopped = true // a heal during shutdown must not listen again
	p.mu.Unlock()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return p.inner.Shutdown(shutdownCtx)
}

// Faults returns what is broken now.
func (p *Proxy) Faults() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faultsLocked()
}

func (p *Proxy) faultsLocked() Faults {
	left := 0
	if d := p.unavailableUntil.Sub(p.now()); d > 0 {
		left = int(math.Ceil(d.Seconds()))
	}
	return Faults{
		DropAnswers: p.dropAnswers, LatencyMS: int(p.latency / time.Millisecond), Cut: p.cut,
		UnavailableSecondsLeft: left, Reject: p.reject,
	}
}

// Counters and Timeline are what the answer faults saw, the newest
// delivery first.
func (p *Proxy) Counters() Counters {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counters
}

// Timeline returns the last deliveries, newest first.
func (p *Proxy) Timeline() []Delivery {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.timeline)
	out := make([]Delivery, 0, n)
	for i := range n {
		out = append(out, p.timeline[((p.next-1-i)%n+n)%n])
	}
	return out
}

// record adds d to the timeline, at the time its answer went (or was
// dropped), so that the timeline is in the order the sender saw answers.
func (p *Proxy) record(d Delivery) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d.Time = p.now()
	if len(p.timeline) < timelineSize {
		p.timeline = append(p.timeline, d)
	} else {
		p.timeline[p.next] = d
	}
	p.next = (p.next + 1) % timelineSize
}

// SetDropAnswers turns the dropping of Users' answers on or off.
func (p *Proxy) SetDropAnswers(on bool) Faults {
	p.mu.Lock()
	p.dropAnswers = on
	p.mu.Unlock()
	return p.changed()
}

// SetReject turns refusing every request as invalid, in Users' place, on or
// off.
func (p *Proxy) SetReject(on bool) Faults {
	p.mu.Lock()
	p.reject = on
	p.mu.Unlock()
	return p.changed()
}

// SetUnavailable answers 503 in Users' place for d (0 ends it now).
func (p *Proxy) SetUnavailable(d time.Duration) Faults {
	p.mu.Lock()
	p.unavailableUntil = p.now().Add(d)
	p.mu.Unlock()
	return p.changed()
}

// SetLatency holds every answer of Users back by d, give or take a tenth
// (0 turns it off).
func (p *Proxy) SetLatency(d time.Duration) Faults {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
	return p.changed()
}

// SetCut closes every connection and refuses new ones, or listens again.
func (p *Proxy) SetCut(on bool) (Faults, error) {
	p.mu.Lock()
	err := p.setCut(on)
	p.mu.Unlock()
	return p.changed(), err
}

func (p *Proxy) setCut(on bool) error {
	if on && !p.cut {
		p.toxi.Stop()
	}
	if !on && p.cut && !p.stopped {
		// Toxiproxy keeps the port it had, so the sender finds it again.
		if err := p.toxi.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
			return fmt.Errorf("listen again: %w", err)
		}
	}
	p.cut = on
	return nil
}

// Heal turns every fault off.
func (p *Proxy) Heal() (Faults, error) {
	p.mu.Lock()
	p.dropAnswers, p.reject, p.unavailableUntil = false, false, time.Time{}
	p.latency = 0
	err := p.setCut(false)
	p.mu.Unlock()
	return p.changed(), err
}

// changed logs what is broken after a change, and returns it. A change
// that failed is logged once, where the API renders its error.
func (p *Proxy) changed() Faults {
	f := p.Faults()
	p.log.Info("faults changed", slog.String("faults", f.describe()))
	return f
}
