package httpapi

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/testkit/apitest"
)

const callerToken = "sender-token-0123456789abcdef"

// callersRouter is NewRouter with a route only a caller may use, as the
// APIs have: POST /people, which decodes a person, for the token
// callerToken.
func callersRouter(t *testing.T) http.Handler {
	t.Helper()
	r := NewRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return nil })
	tokens := auth.NewTokens([]auth.Credential{{Caller: "outbox-sender", Token: callerToken}})
	r.With(Authenticate(tokens, `Bearer realm="test"`)).Post("/people", Handle(func(w http.ResponseWriter, r *http.Request) error {
		var in person.Input
		if err := DecodeJSON(w, r, &in); err != nil {
			return err
		}
		return WriteJSON(w, http.StatusCreated, map[string]string{"status": "created"})
	}))
	return r
}

// trickled is a request line and headers declaring a body of 4000 bytes,
// of which the client sends a byte at a time.
func trickled(requestLine string, headers ...string) string {
	return requestLine + "\r\nHost: localhost\r\nContent-Length: 4000\r\n" + strings.Join(headers, "") + "\r\n"
}

// TestUnreadBodiesAreNotWaitedFor: a request answered without its body
// being read, whatever the answer, is answered at once though its body
// trickles in, and its connection closes soon after, long before the
// server's ReadTimeout (15s).
func TestUnreadBodiesAreNotWaitedFor(t *testing.T) {
	t.Parallel()
	api := serveLimited(t, callersRouter(t), 64)
	admin := serveLimited(t, NewAdminRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return nil }, "TEST_ALLOWED_HOSTS", nil), 64)
	authz, json := "Authorization: Bearer "+callerToken+"\r\n", "Content-Type: application/json\r\n"
	tests := []struct {
		name, addr, request string
		status              int
	}{
		{"no token", api, trickled("POST /people HTTP/1.1", json), http.StatusUnauthorized},
		{"no route", api, trickled("POST /nowhere HTTP/1.1", json), http.StatusNotFound},
		{"another method", api, trickled("POST /healthz HTTP/1.1", json), http.StatusMethodNotAllowed},
		{"repeated parameter", api, trickled("POST /people?a=1&a=2 HTTP/1.1", authz, json), http.StatusBadRequest},
		{"another media type", api, trickled("POST /people HTTP/1.1", authz, "Content-Type: text/plain\r\n"), http.StatusUnsupportedMediaType},
		{"a route that takes no body", api, trickled("GET /healthz HTTP/1.1"), http.StatusOK},
		{"a host not listed", admin, strings.Replace(trickled("GET /healthz HTTP/1.1"), "localhost", "example.com", 1), http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", tt.addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			start := time.Now()
			require.NoError(t, c.SetDeadline(start.Add(5*time.Second)))
			_, err = io.WriteString(c, tt.request+"{")
			require.NoError(t, err)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "answered before the body arrived")
			answered := time.Since(start)
			_, err = io.Copy(io.Discard, resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, tt.status, resp.StatusCode)
			require.True(t, resp.Close, "the answer says the connection closes")
			_, err = br.ReadByte()
			require.ErrorIs(t, err, io.EOF, "the connection closes, with the body still short of its length")
			t.Logf("answered after %s, closed after %s", answered, time.Since(start))
		})
	}
}

// TestReadBodiesKeepTheConnection: a request whose body was read to its
// end, accepted or not, leaves the connection open for the next one.
func TestReadBodiesKeepTheConnection(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, callersRouter(t), 64)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(c)
	for _, tt := range []struct {
		body   string
		status int
	}{
		{apitest.PersonBody("Ada Lovelace", "ada@example.com", "111-1"), http.StatusCreated},
		{`{"name":1}`, http.StatusBadRequest},
		{apitest.PersonBody("Bob Stone", "bob@example.com", "222-2"), http.StatusCreated},
	} {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/people", strings.NewReader(tt.body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+callerToken)
		req.Header.Set("Content-Type", "application/json")
		require.NoError(t, req.Write(c))
		resp, err := http.ReadResponse(br, req)
		require.NoError(t, err, "the connection is still open")
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, tt.status, resp.StatusCode)
		require.False(t, resp.Close)
	}
}

// TestRefusedBodiesEndInGoodOrder: a client that writes a whole refused
// request before it reads, as many do, reads its answer and then the end
// of the connection, not a reset that could take the answer with it: the
// server reads the rest of the body, for up to UnreadBodyGrace, before it
// closes.
func TestRefusedBodiesEndInGoodOrder(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, callersRouter(t), 64)
	for _, size := range []int{100, MaxBodyBytes, 4 * MaxBodyBytes} {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/people", strings.NewReader(strings.Repeat(" ", size)))
		require.NoError(t, err)
		written := make(chan error, 1)
		go func() { written <- req.Write(c) }()
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.NoError(t, <-written)
		_, err = br.ReadByte()
		require.ErrorIs(t, err, io.EOF, "a body of %d bytes: the connection ends in good order", size)
	}
}
