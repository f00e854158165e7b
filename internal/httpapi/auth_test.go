package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/auth"
)

// failingAuth is an authenticator that breaks, as one reading a remote
// store might.
type failingAuth struct{}

func (failingAuth) Caller(*http.Request) (string, error) { return "", errors.New("token store down") }

// TestAuthenticate: a refused request is a 401 problem with a challenge,
// and the handler behind never runs; an accepted one reaches it with its
// caller in the context and in the request's log line.
func TestAuthenticate(t *testing.T) {
	t.Parallel()
	const token = "sender-token-0123456789abcdef"
	tokens := auth.NewTokens([]auth.Credential{{Caller: "outbox-sender", Token: token}})
	var logs bytes.Buffer
	reached := 0
	r := NewRouter(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), func(context.Context) error { return nil })
	r.With(Authenticate(tokens, `Bearer realm="test"`)).Post("/x", Handle(func(w http.ResponseWriter, r *http.Request) error {
		reached++
		caller, _ := auth.CallerFrom(r.Context())
		return WriteJSON(w, http.StatusOK, map[string]string{"caller": caller})
	}))
	r.With(Authenticate(failingAuth{}, "")).Post("/broken", Handle(func(http.ResponseWriter, *http.Request) error { return nil }))
	send := func(path string, authz ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
		for _, a := range authz {
			req.Header.Add("Authorization", a)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		return w
	}

	tests := []struct {
		name, challenge, detail string
		authz                   []string
	}{
		{name: "no header", challenge: `Bearer realm="test"`, detail: "send Authorization: Bearer <token>"},
		{name: "wrong token", authz: []string{"Bearer wrong-token-0123456789abcdef"}, challenge: `Bearer realm="test", error="invalid_token"`, detail: "not valid"},
		{name: "malformed", authz: []string{"Token " + token}, challenge: `Bearer realm="test", error="invalid_token"`, detail: "Bearer scheme"},
	}
	for _, tt := range tests {
		w := send("/x", tt.authz...)
		require.Equal(t, http.StatusUnauthorized, w.Code, tt.name)
		require.Equal(t, tt.challenge, w.Header().Get("WWW-Authenticate"), tt.name)
		require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"), tt.name)
		var p Problem
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), tt.name)
		require.Equal(t, TypeUnauthorized, p.Type, tt.name)
		require.Contains(t, p.Detail, tt.detail, tt.name)
		require.NotContains(t, w.Body.String(), token)
	}
	require.Zero(t, reached, "a refused request never reaches the handler")

	w := send("/x", "Bearer "+token)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.JSONEq(t, `{"caller":"outbox-sender"}`, w.Body.String())
	require.Equal(t, 1, reached)
	require.Contains(t, logs.String(), `"caller":"outbox-sender"`, "the caller is in the request's log line")
	require.NotContains(t, logs.String(), token)

	// An authenticator that fails is the server's problem: a bare 500,
	// logged with its cause, and no challenge.
	w = send("/broken", "Bearer "+token)
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Empty(t, w.Header().Get("WWW-Authenticate"))
	require.Contains(t, logs.String(), "token store down")
}
