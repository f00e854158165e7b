package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestAdminRefusesNonCanonicalIDs: a row id in a path is its decimal form
// only; "+1", "01" and the like are 400 naming id, and a redrive sent to
// one changes nothing.
func TestAdminRefusesNonCanonicalIDs(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	admin := adminAPI(t, pool)
	addStudents(t, pool, 1)
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'expired' RETURNING id").Scan(&id))
	canonical := strconv.FormatInt(id, 10)
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, admin+"/outbox/"+canonical, "").Status)

	for _, other := range []string{"+" + canonical, "0" + canonical, canonical + "%20", "%20" + canonical, "0x" + canonical, "-" + canonical, "0"} {
		res := apitest.Do(t, http.MethodGet, admin+"/outbox/"+other, "")
		require.Equal(t, http.StatusBadRequest, res.Status, other)
		require.Equal(t, []string{"id"}, res.Problem(t).Fields(), other)

		res = apitest.Do(t, http.MethodPost, admin+"/outbox/"+other+"/redrive", `{"mode":"retry"}`)
		require.Equal(t, http.StatusBadRequest, res.Status, other)
		require.Equal(t, []string{"id"}, res.Problem(t).Fields(), other)
	}
	// A redrive body that is not valid UTF-8, or a repeated parameter, is
	// refused as well.
	res := apitest.Do(t, http.MethodPost, admin+"/outbox/"+canonical+"/redrive", `{"mode":"retry`+"\xff"+`"}`)
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"mode"}, res.Problem(t).Fields())
	res = apitest.Do(t, http.MethodPost, admin+"/outbox/"+canonical+"/redrive?force=1&force=1", `{"mode":"retry"}`)
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"force"}, res.Problem(t).Fields())

	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND redrives = 0"), "nothing was redriven")
	require.Equal(t, 0, count(t, pool, "SELECT count(*) FROM outbox_events"))
}

// TestAdminProblemTypesResolve: the types the admin routes send resolve on
// the admin port, the listener that sends them.
func TestAdminProblemTypesResolve(t *testing.T) {
	t.Parallel()
	admin := adminAPI(t, pgtest.Pool(t, migrations.Student))
	for _, typ := range []string{httpapi.TypeOutboxRowNotDead, httpapi.TypeNewKeyUnsafe, httpapi.TypeRedriveLimit, httpapi.TypeOutboxRowBusy, httpapi.TypeUnsupportedMediaType, httpapi.TypeValidation, httpapi.TypeNotFound} {
		res := apitest.Do(t, http.MethodGet, admin+typ, "")
		require.Equal(t, http.StatusOK, res.Status, typ)
		require.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"), typ)
	}
}

// TestRunbookBulkAnswerIsTrue: the bulk redrive's answer in
// docs/runbook.md is the answer's form: no field missing, none that is
// not there, and its counts agree.
func TestRunbookBulkAnswerIsTrue(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../docs/runbook.md")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(page), "A bulk redrive answers, for instance, `")
	require.True(t, ok, "the runbook shows a bulk redrive's answer")
	example, _, _ := strings.Cut(after, "`")
	dec := json.NewDecoder(strings.NewReader(example))
	dec.DisallowUnknownFields()
	var b Bulk
	require.NoError(t, dec.Decode(&b), "%s", example)
	again, err := json.Marshal(b)
	require.NoError(t, err)
	require.JSONEq(t, example, string(again), "every field the answer writes is in the example")
	require.Equal(t, len(b.IDs), b.Matched)
}

// TestEveryStateIsNamed: wherever an operator learns which states a list
// takes, every state of the outbox is named, published too: it is where
// every row waits while Users is down behind the broker, and a list of
// them is the first thing an operator asks for then.
func TestEveryStateIsNamed(t *testing.T) {
	t.Parallel()
	_, err := parseFilter("state=waiting")
	p, ok := errors.AsType[*httpapi.Problem](err)
	require.True(t, ok, "%v", err)
	require.Len(t, p.Errors, 1)
	var usage bytes.Buffer
	dead := Command(time.Second, DefaultMaxRedrives, DefaultKeyWindow)
	require.NoError(t, dead(context.Background(), nil, []string{"list", "--help"}, &usage))
	page, err := os.ReadFile("../../docs/runbook.md")
	require.NoError(t, err)
	_, row, ok := strings.Cut(string(page), "\n| `GET /outbox?state=")
	require.True(t, ok, "the runbook's admin API table has its GET /outbox row")
	row, _, _ = strings.Cut(row, "\n")
	for _, state := range outbox.States {
		require.Contains(t, p.Errors[0].Detail, state, "the 400 for a bad state")
		require.Contains(t, usage.String(), state, "dead list's usage")
		require.Regexp(t, `\b`+state+`\b`, row, "the runbook's GET /outbox row")
	}
	_, err = parseFilter("state=" + outbox.StatePublished)
	require.NoError(t, err)
}
