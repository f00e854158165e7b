// Package apitest owns the small HTTP client the services' tests use to
// call an API and read its answer.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/freeport"
)

// Response is an answer read in full.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v, failing the test if it is not JSON.
func (r Response) JSON(t testing.TB, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.Body, v), "body: %s", r.Body)
}

// Problem is the decoded form of a problem+json body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Errors []struct {
		Field  string `json:"field"`
		Detail string `json:"detail"`
	} `json:"errors"`
	Dependencies map[string]string `json:"dependencies"`
}

// Fields lists the fields the problem names.
func (p Problem) Fields() []string {
	var out []string
	for _, e := range p.Errors {
		out = append(out, e.Field)
	}
	return out
}

// Problem decodes a problem+json answer, checking its media type and that
// its status member matches the response status.
func (r Response) Problem(t testing.TB) Problem {
	t.Helper()
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "body: %s", r.Body)
	var p Problem
	r.JSON(t, &p)
	require.Equal(t, r.Status, p.Status)
	return p
}

// Do sends a request with an optional JSON body and extra headers (name,
// value pairs; "Host" sets the request's host name), bounded by ten seconds. A transport error is reported with
// t.Errorf and a zero Response, never t.FailNow, so Do is safe to call from
// the goroutines of a concurrency test.
func Do(t testing.TB, method, url, body string, headers ...string) Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewBufferString(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Errorf("build request: %v", err)
		return Response{}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Host" { // net/http sends req.Host, not a Host header
			req.Host = headers[i+1]
			continue
		}
		if http.CanonicalHeaderKey(headers[i]) == "Content-Type" {
			req.Header.Del("Content-Type") // the caller's replaces the default
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return Response{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("%s %s: read body: %v", method, url, err)
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// PostOver posts a JSON body to url through client, with extra headers
// (name, value pairs), and requires the answer's status to be want. It
// reports whether the request went over a connection the client had kept
// open from before.
func PostOver(t testing.TB, client *http.Client, url, body string, want int, headers ...string) (reused bool) {
	t.Helper()
	trace := &httptrace.ClientTrace{GotConn: func(c httptrace.GotConnInfo) { reused = c.Reused }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want, resp.StatusCode, "%s", b)
	return reused
}

// Count runs a count(*) style query and returns the number.
func Count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n), sql)
	return n
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago and that no other caller in this process got (freeport.Addr), for a
// server under test to listen on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	require.NoError(t, err)
	return addr
}

// Env turns name, value pairs into a getenv function.
func Env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// Start runs run in the background and returns a function that ends run's
// context and returns its error. It is the one way tests run something until
// told to stop: a sender, a server, a loop. If the test does not call stop,
// cleanup does; either way the test fails if run has not returned within ten
// seconds of its context ending.
func Start(t testing.TB, run func(ctx context.Context) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var (
		once sync.Once
		err  error
	)
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Error("did not stop within 10s of its context ending")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// RunUntilReady is Start, then a wait until url answers 200. The test fails
// if that takes more than ten seconds or run returns first.
func RunUntilReady(t testing.TB, url string, run func(ctx context.Context) error) (stop func() error) {
	t.Helper()
	exited := make(chan error, 1)
	stop = Start(t, func(ctx context.Context) error {
		err := run(ctx)
		exited <- err
		return err
	})
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(url) //nolint:noctx // each try is bounded by the client's timeout
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return stop
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 10s (last error: %v)", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WithToken serves h to requests that carry no Authorization header as if
// they carried token: tests of routes behind a token use it to send every
// request as one caller, while the tests of the authentication itself call
// h directly.
func WithToken(h http.Handler, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		h.ServeHTTP(w, r)
	})
}

// RequireHostsChecked checks that the admin listener at base answers a
// name it was not given, such as one a rebinding page points at 127.0.0.1,
// with 403 naming variable, on each of paths, while its own name passes.
func RequireHostsChecked(t testing.TB, base, variable string, paths ...string) {
	t.Helper()
	for _, path := range append([]string{"/healthz", "/readyz", "/metrics"}, paths...) {
		res := Do(t, http.MethodGet, base+path, "", "Host", "evil.example")
		require.Equal(t, http.StatusForbidden, res.Status, "GET %s with Host evil.example: %s", path, res.Body)
		require.Contains(t, res.Problem(t).Detail, variable, "the refusal says where to allow a name")
	}
	require.Equal(t, http.StatusOK, Do(t, http.MethodGet, base+"/healthz", "").Status, "loopback passes")
}
