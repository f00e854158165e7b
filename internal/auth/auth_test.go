package auth

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	senderToken = "sender-token-0123456789abcdef"
	adminToken  = "admin-token-0123456789abcdef=="
)

func TestParseTokens(t *testing.T) {
	t.Parallel()
	creds, err := ParseTokens(" outbox-sender:" + senderToken + " ,\n\nadmin:" + adminToken + "\n")
	require.NoError(t, err)
	require.Equal(t, []Credential{{Caller: "outbox-sender", Token: senderToken}, {Caller: "admin", Token: adminToken}}, creds)

	tests := []struct {
		name, in, want string
	}{
		{name: "no colon", in: senderToken, want: "entry 1: want caller:token"},
		{name: "caller not a slug", in: "Outbox Sender:" + senderToken, want: "entry 1: the caller must be a lowercase name"},
		{name: "token and caller swapped", in: senderToken + ":sender", want: "entry 1: a token must be at least 16"},
		{name: "empty caller", in: ":" + senderToken, want: "entry 1: the caller must be"},
		{name: "short token", in: "a:" + senderToken + ",b:changeme", want: "entry 2: a token must be at least 16 characters"},
		{name: "token with a space", in: "a:two words but long enough", want: "entry 1: a token may hold letters"},
		{name: "one entry twice", in: "a:" + senderToken + ",a:" + senderToken, want: `callers "a" and "a" have the same token`},
		{name: "token twice", in: "a:" + senderToken + "\nb:" + senderToken, want: `callers "a" and "b" have the same token`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseTokens(tt.in)
			require.ErrorContains(t, err, tt.want)
			for _, tok := range []string{senderToken, adminToken, "changeme", "two words"} {
				require.NotContains(t, err.Error(), tok, "an error never shows a token")
			}
		})
	}
	// A caller listed twice has two valid tokens: a rotation in progress.
	creds, err = ParseTokens("a:" + senderToken + ",a:" + adminToken)
	require.NoError(t, err)
	rotating := NewTokens(creds)
	for _, tok := range []string{senderToken, adminToken} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		caller, err := rotating.Caller(r)
		require.NoError(t, err)
		require.Equal(t, "a", caller)
	}

	creds, err = ParseTokens(" , \n")
	require.NoError(t, err)
	require.Empty(t, creds, "nothing listed is no caller; Run decides whether that is allowed")
}

func TestCheckToken(t *testing.T) {
	t.Parallel()
	require.NoError(t, CheckToken("abcdefghijklmnop"))
	require.NoError(t, CheckToken("aZ09-._~+/aZ09-._~+/=="))
	require.ErrorContains(t, CheckToken("short"), "at least 16")
	require.ErrorContains(t, CheckToken(strings.Repeat("=", 20)), "may hold")
	require.ErrorContains(t, CheckToken("abcdefgh=ijklmnop"), "may hold", "= only at the end")
	require.ErrorContains(t, CheckToken("abcdefghijklmnop\n"), "may hold")
}

func TestTokensCaller(t *testing.T) {
	t.Parallel()
	a := NewTokens([]Credential{{Caller: "outbox-sender", Token: senderToken}, {Caller: "admin", Token: adminToken}})
	tests := []struct {
		name    string
		headers []string
		caller  string
		missing bool
		detail  string
	}{
		{name: "sender", headers: []string{"Bearer " + senderToken}, caller: "outbox-sender"},
		{name: "admin, scheme in any case", headers: []string{"bearer  " + adminToken}, caller: "admin"},
		{name: "no header", missing: true, detail: "send Authorization: Bearer <token>"},
		{name: "wrong token", headers: []string{"Bearer " + senderToken + "x"}, detail: "not valid"},
		{name: "a prefix of a token", headers: []string{"Bearer " + senderToken[:20]}, detail: "not valid"},
		{name: "basic scheme", headers: []string{"Basic " + senderToken}, detail: "Bearer scheme"},
		{name: "scheme only", headers: []string{"Bearer"}, detail: "malformed"},
		{name: "token with a comma", headers: []string{"Bearer " + senderToken + ",x"}, detail: "malformed"},
		{name: "two headers", headers: []string{"Bearer " + senderToken, "Bearer " + senderToken}, detail: "not 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, h := range tt.headers {
				r.Header.Add("Authorization", h)
			}
			caller, err := a.Caller(r)
			if tt.caller != "" {
				require.NoError(t, err)
				require.Equal(t, tt.caller, caller)
				return
			}
			var ce *CredentialsError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tt.missing, ce.Missing)
			require.Contains(t, ce.Detail, tt.detail)
			require.NotContains(t, ce.Detail, senderToken[:16], "the detail never echoes what was sent")
		})
	}

	// With no callers configured, nothing is accepted.
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+senderToken)
	_, err := NewTokens(nil).Caller(r)
	require.Error(t, err)
}

func TestSecretIsNeverPrinted(t *testing.T) {
	t.Parallel()
	c := Credential{Caller: "outbox-sender", Token: senderToken}
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c.Token)} {
		require.NotContains(t, s, senderToken)
	}
	var b strings.Builder
	slog.New(slog.NewJSONHandler(&b, nil)).Info("x", slog.Any("token", c.Token), slog.Any("cred", c))
	require.NotContains(t, b.String(), senderToken)
}

func TestCallerContext(t *testing.T) {
	t.Parallel()
	_, ok := CallerFrom(context.Background())
	require.False(t, ok)
	caller, ok := CallerFrom(WithCaller(context.Background(), "admin"))
	require.True(t, ok)
	require.Equal(t, "admin", caller)
}
