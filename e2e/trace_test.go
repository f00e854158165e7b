//go:build e2e

package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// The spans' names, as internal/telemetry and internal/inbox make them.
const (
	deliverSpan   = "deliver create-user"
	inboxSpan     = "inbox transaction"
	postUsersSpan = "POST /users"
)

// tracingEnv is what every process of a scenario with opts.otlp gets: the
// standard OTEL_* variables, and a short batching delay so that spans
// arrive within the test's patience rather than after the SDK's 5s.
func (s *scenario) tracingEnv() []string {
	if s.def.opts.otlp == "" {
		return nil
	}
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + s.def.opts.otlp, "OTEL_BSP_SCHEDULE_DELAY=100"}
}

// span is one received span with the service that sent it.
type span struct {
	service             string
	name                string
	traceID, id, parent string
	attrs               map[string]*commonpb.AnyValue
	errored             bool
}

func (sp span) int(key string) int64  { return sp.attrs[key].GetIntValue() }
func (sp span) str(key string) string { return sp.attrs[key].GetStringValue() }

// otlpReceiver is an OTLP/HTTP trace receiver, protobuf encoding, as a
// collector (Jaeger, in compose) runs one on :4318.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) export(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []span
	for _, rs := range msg.GetResourceSpans() {
		service := attrMap(rs.GetResource().GetAttributes())["service.name"].GetStringValue()
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				got = append(got, span{
					service: service, name: sp.GetName(),
					traceID: hex.EncodeToString(sp.GetTraceId()), id: hex.EncodeToString(sp.GetSpanId()),
					parent: hex.EncodeToString(sp.GetParentSpanId()), attrs: attrMap(sp.GetAttributes()),
					errored: sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				})
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func attrMap(kvs []*commonpb.KeyValue) map[string]*commonpb.AnyValue {
	m := make(map[string]*commonpb.AnyValue, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = kv.GetValue()
	}
	return m
}

// trace returns the spans received so far for traceID.
func (r *otlpReceiver) trace(traceID string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, sp := range r.spans {
		if sp.traceID == traceID {
			out = append(out, sp)
		}
	}
	return out
}

// traceOf returns the trace id and parent span id stored with the
// student's outbox row: the trace of the POST /students that created it.
func (s *scenario) traceOf(student uuid.UUID) (traceID, parentID string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	var tp *string
	require.NoError(s.t, s.studentDB.QueryRow(ctx, "SELECT trace_parent FROM outbox WHERE student_id = $1", student).Scan(&tp))
	require.NotNil(s.t, tp, "the outbox row holds no trace_parent although Student traces")
	parts := strings.Split(*tp, "-")
	require.Len(s.t, parts, 4, "traceparent %q", *tp)
	require.Equal(s.t, "00", parts[0], "traceparent %q", *tp)
	return parts[1], parts[2]
}

// attemptsOf is the number of delivery attempts the outbox row records.
func (s *scenario) attemptsOf(student uuid.UUID) int {
	return s.count(s.studentDB, fmt.Sprintf("SELECT attempts FROM outbox WHERE student_id = '%s'", student))
}

// traceScenario starts a system whose three processes export their spans
// to a receiver of the test's own.
func traceScenario(t *testing.T, id, title string) (*scenario, *otlpReceiver) {
	t.Helper()
	rcv := newOTLPReceiver(t)
	s := newScenario(t, scenarioDef{id: id, title: title, opts: scenarioOptions{senders: 1, otlp: rcv.srv.URL}}, suite.good)
	return s, rcv
}

// createOne posts one student through Student's API and waits for its
// answer.
func (s *scenario) createOne() uuid.UUID {
	s.t.Helper()
	l := s.startLoad(1, time.Millisecond)
	require.True(s.t, l.wait(30*time.Second), "POST /students did not finish")
	ids := l.ackedIDs()
	require.Len(s.t, ids, 1, "POST /students was not answered 201")
	return ids[0]
}

// wholeTrace waits until the trace of the student holds what a linked
// student's trace must (the span stored with the outbox row, one deliver
// span per recorded attempt, and under the last one Users' request span
// with its inbox span) and returns it, failing t after a bound.
func (s *scenario) wholeTrace(rcv *otlpReceiver, student uuid.UUID) (spans []span, parentID string) {
	s.t.Helper()
	traceID, parentID := s.traceOf(student)
	attempts := s.attemptsOf(student)
	require.Positive(s.t, attempts)
	deadline := time.Now().Add(20 * time.Second)
	for {
		spans = rcv.trace(traceID)
		delivers := named(spans, deliverSpan)
		if _, stored := byID(spans, parentID); stored && len(delivers) == attempts {
			if _, ok := lastInbox(spans); ok {
				return spans, parentID
			}
		}
		if time.Now().After(deadline) {
			require.FailNow(s.t, "the trace never became whole",
				"trace %s after 20s: %d spans, %d deliver spans for %d attempts:\n%s", traceID, len(spans), len(delivers), attempts, describeSpans(spans))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lastInbox is Users' inbox span under the request of the last delivery
// attempt.
func lastInbox(spans []span) (span, bool) {
	var last span
	for _, d := range named(spans, deliverSpan) {
		if d.int("attempt") > last.int("attempt") || last.name == "" {
			last = d
		}
	}
	for _, req := range spans {
		if req.service != "users" || req.name != postUsersSpan || req.parent != last.id || last.id == "" {
			continue
		}
		for _, ib := range spans {
			if ib.service == "users" && ib.name == inboxSpan && ib.parent == req.id {
				return ib, true
			}
		}
	}
	return span{}, false
}

func named(spans []span, name string) []span {
	var out []span
	for _, sp := range spans {
		if sp.name == name {
			out = append(out, sp)
		}
	}
	return out
}

func hasService(spans []span, service string) bool {
	return slices.ContainsFunc(spans, func(sp span) bool { return sp.service == service })
}

func byID(spans []span, id string) (span, bool) {
	i := slices.IndexFunc(spans, func(sp span) bool { return sp.id == id })
	if i < 0 {
		return span{}, false
	}
	return spans[i], true
}

func describeSpans(spans []span) string {
	var b bytes.Buffer
	for _, sp := range spans {
		fmt.Fprintf(&b, "  %-14s %-22s id %s parent %s attempt %d verdict %q replayed %v outcome %q\n",
			sp.service, sp.name, sp.id, sp.parent, sp.int("attempt"), sp.str("verdict"),
			sp.attrs["replayed"].GetBoolValue(), sp.str("outcome"))
	}
	return b.String()
}

// checkChain checks how the spans hang together: every deliver span is a
// child of the span stored with the outbox row, which Student exported;
// every Users request span is a child of a deliver span; every inbox span
// in Users is a child of a Users request span.
func checkChain(t *testing.T, spans []span, parentID string) {
	t.Helper()
	stored, ok := byID(spans, parentID)
	require.True(t, ok, "the span stored with the outbox row (%s) was not exported:\n%s", parentID, describeSpans(spans))
	require.Equal(t, "student", stored.service)
	root, ok := stored, true
	for ok && root.parent != "" {
		root, ok = byID(spans, root.parent)
	}
	require.True(t, ok, "the chain above the stored span breaks:\n%s", describeSpans(spans))
	require.Equal(t, "POST /students", root.name, "the trace's root is Student's request span")

	for _, d := range named(spans, deliverSpan) {
		require.Equal(t, "outbox-sender", d.service)
		require.Equal(t, parentID, d.parent, "a deliver span continues the stored trace context")
	}
	for _, sp := range spans {
		switch {
		case sp.service == "users" && sp.name == postUsersSpan:
			p, ok := byID(spans, sp.parent)
			require.True(t, ok && p.name == deliverSpan, "Users' request span %s has no deliver span as parent", sp.id)
		case sp.service == "users" && sp.name == inboxSpan:
			p, ok := byID(spans, sp.parent)
			require.True(t, ok && p.name == postUsersSpan, "Users' inbox span %s is not under its request span", sp.id)
		}
	}
}

// TestTrace shows one trace per operation across the three processes: the
// student's POST, every delivery attempt, and Users' inbox transaction,
// with the trace context carried by the outbox row in between.
func TestTrace(t *testing.T) {
	t.Run("one-student", func(t *testing.T) {
		s, rcv := traceScenario(t, "t1-trace-one-student", "one student, one trace across the three processes")
		student := s.createOne()
		s.eventually(30*time.Second, "the student is linked", func() bool {
			return s.count(s.studentDB, fmt.Sprintf("SELECT count(*) FROM students WHERE id = '%s' AND user_id IS NOT NULL", student)) == 1
		})
		require.Empty(t, s.violations)
		spans, parentID := s.wholeTrace(rcv, student)
		t.Logf("trace of student %s:\n%s", student, describeSpans(spans))

		for _, service := range []string{"student", "outbox-sender", "users"} {
			require.True(t, hasService(spans, service), "no span from %s in the trace", service)
		}
		checkChain(t, spans, parentID)
		delivers := named(spans, deliverSpan)
		require.Len(t, delivers, 1, "one attempt, one deliver span")
		d := delivers[0]
		require.EqualValues(t, 1, d.int("attempt"))
		require.Equal(t, "delivered", d.str("verdict"))
		require.Equal(t, student.String(), d.str("student.id"))
		require.NotEmpty(t, d.str("idempotency_key"))
		require.Positive(t, d.int("outbox.id"))
		inbox, _ := lastInbox(spans)
		require.Equal(t, "new", inbox.str("outcome"), "Users ran the operation in its inbox transaction")
		require.False(t, inbox.attrs["replayed"].GetBoolValue())

		out := s.settle()
		require.Empty(t, out.violations)
	})

	// As scenario 01: Users commits, and its answers are reset on the way
	// back until the test heals the network. Every attempt is a span of
	// the same trace, and the attempt that finally gets an answer gets
	// Users' replay.
	t.Run("answer-lost", func(t *testing.T) {
		s, rcv := traceScenario(t, "t2-trace-answer-lost", "answers lost: every attempt in one trace")
		s.toxi.add("lose-answers", "reset_peer", "downstream", map[string]any{"timeout": 0})
		student := s.createOne()
		s.eventually(30*time.Second, "Users committed the user and the sender tried again", func() bool {
			return s.count(s.usersDB, "SELECT count(*) FROM users") == 1 && s.attemptsOf(student) >= 2
		})
		s.toxi.remove("lose-answers")
		s.eventually(30*time.Second, "the student is linked", func() bool {
			return s.count(s.studentDB, fmt.Sprintf("SELECT count(*) FROM students WHERE id = '%s' AND user_id IS NOT NULL", student)) == 1
		})
		require.Empty(t, s.violations)
		spans, parentID := s.wholeTrace(rcv, student)
		t.Logf("trace of student %s:\n%s", student, describeSpans(spans))
		checkChain(t, spans, parentID)

		delivers := named(spans, deliverSpan)
		require.GreaterOrEqual(t, len(delivers), 2, "the lost answers' attempts are in the trace")
		slices.SortFunc(delivers, func(a, b span) int { return int(a.int("attempt") - b.int("attempt")) })
		for i, d := range delivers {
			require.EqualValues(t, i+1, d.int("attempt"), "one deliver span per attempt, numbered 1, 2, ...")
			want := "retry"
			if i == len(delivers)-1 {
				want = "delivered"
			}
			require.Equal(t, want, d.str("verdict"), "attempt %d", i+1)
		}
		require.Equal(t, "users-unreachable", delivers[0].str("reason_class"))
		require.True(t, delivers[0].errored, "a failed attempt's span is marked as an error")

		var created, replayed int
		for _, sp := range named(spans, inboxSpan) {
			if sp.service != "users" {
				continue
			}
			switch {
			case sp.str("outcome") == "new":
				created++
			case sp.attrs["replayed"].GetBoolValue():
				replayed++
			}
		}
		require.Equal(t, 1, created, "Users ran the operation once")
		require.GreaterOrEqual(t, replayed, 1, "Users' replay of the stored answer is in the trace")
		last, _ := lastInbox(spans)
		require.True(t, last.attrs["replayed"].GetBoolValue(), "the attempt that got an answer got Users' replay")
		require.Equal(t, "replayed", last.str("outcome"))

		out := s.settle()
		require.Empty(t, out.violations)
	})
}
