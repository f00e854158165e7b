// Package usershttp is the outbox sender's transport to Users over HTTP:
// POST /users with the row's payload, its idempotency key as
// Idempotency-Key and the sender's bearer token, and the judgement of
// Users' answer (package answer): delivered, worth retrying, or permanent.
package usershttp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/alarm"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/telemetry"
	"github.com/outboxref/outboxref/outbox-sender/answer"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// Config is what the transport needs of the sender's configuration.
type Config struct {
	URL         string        // SENDER_USERS_URL
	Token       auth.Secret   // SENDER_USERS_TOKEN
	Timeout     time.Duration // SENDER_REQUEST_TIMEOUT: per delivery
	Concurrency int           // SENDER_CONCURRENCY: connections worth keeping open
}

// Transport delivers rows to Users over HTTP.
type Transport struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	// authAlarm paces the error logged when Users refuses the sender's
	// credentials: loud, but not a line per row.
	authAlarm alarm.Alarm
	// duration is one POST /users, from sending to the answer or failure.
	duration prometheus.Histogram
	// authFailures counts deliveries Users refused for the sender's
	// credentials: any increase is a misconfiguration to fix now, since
	// every row fails alike until it is.
	authFailures *prometheus.CounterVec
}

// New returns a Transport to the Users at cfg.URL.
func New(log *slog.Logger, cfg Config) *Transport {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.Concurrency
	t := &Transport{
		cfg: cfg, log: log,
		client: &http.Client{Transport: transport, Timeout: cfg.Timeout},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_sender_request_duration_seconds",
			Help:    "Time from sending a row to Users until its answer (or failure).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_sender_auth_failures_total",
			Help: "Deliveries Users refused for the sender's credentials (401 or 403), by status: a misconfiguration, alert on any increase.",
		}, []string{"status"}),
	}
	// Both series exist from the start, so an alert's increase() sees the
	// first refusal.
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		t.authFailures.WithLabelValues(strconv.Itoa(status))
	}
	return t
}

// Collectors returns the transport's metrics.
func (t *Transport) Collectors() []prometheus.Collector {
	return []prometheus.Collector{t.duration, t.authFailures}
}

// Deliver sends one row to Users and judges the answer. A shutdown does
// not cut the request short: an answer Users already committed is better
// recorded now than found again by a redelivery.
func (t *Transport) Deliver(ctx context.Context, row store.Row) relay.Answer {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(t.cfg.URL, "/")+"/users", strings.NewReader(string(row.Payload)))
	if err != nil {
		return relay.Answer{Verdict: relay.Permanent, Class: outbox.ReasonSenderError, Error: fmt.Sprintf("build request: %v", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", row.IdempotencyKey.String())
	req.Header.Set("X-Request-Id", requestID(row))
	// Users scopes the key to the caller this token names.
	req.Header.Set("Authorization", "Bearer "+string(t.cfg.Token))
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
	defer func() { t.duration.Observe(time.Since(start).Seconds()) }()
	resp, err := t.client.Do(req)
	if err != nil {
		return transient(outbox.ReasonUsersUnreachable, fmt.Sprintf("POST /users: %v", err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return transient(outbox.ReasonUsersUnreachable, fmt.Sprintf("POST /users: read answer: %v", err))
	}
	a := t.judge(ctx, row, resp, body)
	a.Status = resp.StatusCode
	return a
}

// requestID is the X-Request-Id the sender sends with an attempt: Users'
// request log line carries it, so a grep for the key finds every attempt
// of the operation in Users' logs, and the suffix tells them apart. It
// stays within what Users accepts as a request id (1-128 characters of
// [A-Za-z0-9._:/-]): a UUID, a slash and a number.
func requestID(row store.Row) string {
	return row.IdempotencyKey.String() + "/" + strconv.Itoa(row.Attempts)
}

func transient(class, why string) relay.Answer {
	return relay.Answer{Verdict: relay.Transient, Class: class, Error: why}
}

// judge classifies Users' answer (answer.Judge, which the broker transport
// shares), and notes a refusal of the sender's credentials and a
// Retry-After.
func (t *Transport) judge(ctx context.Context, row store.Row, resp *http.Response, body []byte) relay.Answer {
	a := answer.Judge(resp.StatusCode, isProblem(resp.Header.Get("Content-Type")), body)
	if a.Verdict != relay.Transient {
		return a
	}
	a.RetryAfter = retryAfter(resp)
	if a.Class == outbox.ReasonUsersAuthRefused {
		t.authRefused(ctx, row, resp.StatusCode)
		a.Error += ": Users refused the sender's credentials (check SENDER_USERS_TOKEN)"
	}
	return a
}

// isProblem says whether an answer's Content-Type is a problem document's:
// only then is its body read as one (a proxy's error page is not).
func isProblem(contentType string) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	return mt == httpapi.ProblemContentType
}

// authRefused notes a 401 or 403: Users, or a proxy in front of it,
// refused the sender's credentials. That says nothing about the row, whose
// request Users never looked at: every row gets the same answer until a
// person fixes SENDER_USERS_TOKEN or USERS_API_TOKENS. The row is retried
// like any transient failure (and never dead-lettered for it, see
// relay's retryOrDie), while the sender says so loudly: an error log line
// naming the misconfiguration, and a counter.
func (t *Transport) authRefused(ctx context.Context, row store.Row, code int) {
	t.authFailures.WithLabelValues(strconv.Itoa(code)).Inc()
	if refused, ok := t.authAlarm.Ring(time.Now(), authAlarmEvery); ok {
		// The token is never logged; the URL and the status say where to look.
		t.log.LogAttrs(ctx, slog.LevelError, "Users refused the sender's credentials: misconfiguration, SENDER_USERS_TOKEN is missing, wrong, or not among Users' USERS_API_TOKENS; rows are retried, not dead-lettered, until it is fixed",
			append(relay.RowAttrs(row), slog.Int("status", code), slog.String("users_url", Redacted(t.cfg.URL)),
				slog.Int("refused_since_last_log", refused))...)
	}
}

// authAlarmEvery is how often, at most, the sender logs that Users refuses
// its credentials; the counter counts every refusal.
const authAlarmEvery = 10 * time.Second

// retryAfter reads Retry-After in either form (seconds or an HTTP date);
// 0 when absent or unreadable.
func retryAfter(resp *http.Response) time.Duration {
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
	return max(d, 0)
}

// Redacted is u with any password in it masked: the address of Users is
// worth a log line, a password someone put in it is not.
func Redacted(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparsable)"
	}
	return parsed.Redacted()
}
