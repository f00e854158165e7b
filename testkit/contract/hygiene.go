package contract

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
)

// HygieneTarget is a service's create endpoint under the HTTP hygiene
// suite: what the Limits table of docs/operating.md promises for refused input.
type HygieneTarget struct {
	Target
	// ShortReadURL is Target.URL served by a server whose ReadTimeout is
	// short (a second or less), for the slow-body check.
	ShortReadURL string
	// ItemURL is the prefix of one resource's URL, such as base +
	// "/students/", for the checks of ids in paths.
	ItemURL string
}

// Hygiene sends each kind of input the services refuse and checks its
// answer, and that nothing was created and the idempotency key sent with
// it is still free.
func Hygiene(t *testing.T, tg HygieneTarget) {
	t.Helper()
	var auth []string
	if tg.Token != "" {
		auth = []string{"Authorization", "Bearer " + tg.Token}
	}
	post := func(t *testing.T, url, body string, headers ...string) apitest.Response {
		t.Helper()
		return apitest.Do(t, http.MethodPost, url, body, append(append(headers, httpapi.KeyHeader, "hygiene"), auth...)...)
	}
	before := tg.Created(t)
	const rest = `,"email":"ada@example.com","document_number":"111-1"}`

	t.Run("body that stops arriving is 408", func(t *testing.T) {
		res := slowPost(t, tg.ShortReadURL, append([]string{httpapi.KeyHeader, "hygiene"}, auth...), `{"name":"Ada`)
		defer res.Body.Close()
		require.Equal(t, http.StatusRequestTimeout, res.StatusCode)
		require.True(t, res.Close, "Connection: close")
		require.Equal(t, httpapi.ProblemContentType, res.Header.Get("Content-Type"))
		var p httpapi.Problem
		require.NoError(t, json.NewDecoder(res.Body).Decode(&p))
		require.Equal(t, httpapi.TypeRequestTimeout, p.Type)
	})

	refused := []struct {
		situation, body string
		field           string
	}{
		{"invalid UTF-8 in name", `{"name":"Ad` + "\xff" + `a"` + rest, "name"},
		{"invalid UTF-8 in email", `{"name":"Ada","email":"ada` + "\xc3" + `@example.com","document_number":"111-1"}`, "email"},
		{"half a surrogate pair in name", `{"name":"Ada\udc00"` + rest, "name"},
		{"invalid UTF-8 in a key", `{"na` + "\xff" + `me":"Ada"` + rest, "body"},
		{"right-to-left override in name", `{"name":"Ada \u202eecalevoL"` + rest, "name"},
		{"zero-width space in name", `{"name":"Ada\u200bLovelace"` + rest, "name"},
		{"left-to-right isolate in name", `{"name":"Ada\u2066Lovelace\u2069"` + rest, "name"},
		{"byte order mark in name", `{"name":"\ufeffAda"` + rest, "name"},
		{"zero-width space in email", `{"name":"Ada","email":"ada\u200b@example.com","document_number":"111-1"}`, "email"},
	}
	for _, r := range refused {
		t.Run(r.situation, func(t *testing.T) {
			res := post(t, tg.URL, r.body)
			require.Equal(t, http.StatusBadRequest, res.Status, "%s", res.Body)
			p := res.Problem(t)
			require.Equal(t, httpapi.TypeValidation, p.Type)
			require.Equal(t, []string{r.field}, p.Fields())
		})
	}

	t.Run("repeated query parameter", func(t *testing.T) {
		res := post(t, tg.URL+"?x=1&x=2", Body("Ada", "ada@example.com", "111-1"))
		require.Equal(t, http.StatusBadRequest, res.Status, "%s", res.Body)
		require.Equal(t, []string{"x"}, res.Problem(t).Fields())
	})
	require.Equal(t, before, tg.Created(t), "a refused request created something")

	t.Run("the key was not consumed", func(t *testing.T) {
		res := post(t, tg.URL, Body("Ada Lovelace", "ada@example.com", "111-1"))
		require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
		require.Empty(t, res.Header.Get(httpapi.ReplayedHeader), "a first answer, not a replay")
		require.Equal(t, before+1, tg.Created(t))
		location := res.Header.Get("Location")
		id := location[strings.LastIndexByte(location, '/')+1:]

		get := func(id string, headers ...string) apitest.Response {
			return apitest.Do(t, http.MethodGet, tg.ItemURL+id, "", append(headers, auth...)...)
		}
		require.Equal(t, http.StatusOK, get(id).Status)
		// As a client would write them in a URL.
		for _, other := range []string{strings.ToUpper(id), strings.ReplaceAll(id, "-", ""), "urn:uuid:" + id, "%7B" + id + "%7D", "%20" + id} {
			res := get(other)
			require.Equal(t, http.StatusBadRequest, res.Status, "%q: %s", other, res.Body)
			require.Equal(t, []string{"id"}, res.Problem(t).Fields(), other)
		}
		res = apitest.Do(t, http.MethodGet, tg.ItemURL+id+"?a=1&a=2", "", auth...)
		require.Equal(t, http.StatusBadRequest, res.Status)
		require.Equal(t, []string{"a"}, res.Problem(t).Fields())
	})

	t.Run("every problem type resolves", func(t *testing.T) {
		base, err := url.Parse(tg.URL)
		require.NoError(t, err)
		for _, pt := range httpapi.ProblemTypes() {
			ref, err := url.Parse(pt.URI)
			require.NoError(t, err)
			res := apitest.Do(t, http.MethodGet, base.ResolveReference(ref).String(), "")
			require.Equal(t, http.StatusOK, res.Status, pt.URI)
			require.Contains(t, string(res.Body), pt.Title, pt.URI)
		}
	})
}

// slowPost sends the headers of a POST announcing a 1 KiB body, then part
// of the body, and then nothing, and returns the answer, whose body the
// caller closes.
func slowPost(t *testing.T, target string, headers []string, partial string) *http.Response {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := new(net.Dialer).DialContext(ctx, "tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1024\r\n", u.RequestURI(), u.Host)
	for i := 0; i+1 < len(headers); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", headers[i], headers[i+1])
	}
	b.WriteString("\r\n" + partial)
	_, err = io.WriteString(conn, b.String())
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	return res
}
