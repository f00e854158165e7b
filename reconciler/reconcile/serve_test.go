package reconcile

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/testkit/apitest"
)

const operatorToken = "reconciler-test-token-0123456789"

// TestServe runs `reconciler serve`: a full pass at start, then incremental
// ones; the last pass's report on /report for an operator's token only;
// the metrics the observability page names on /metrics; and the admin
// port's Host rule, as the sender's.
func TestServe(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.linked()
	lost := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
	admin := apitest.FreeAddr(t)
	base := "http://" + admin
	apitest.RunUntilReady(t, base+"/readyz", func(ctx context.Context) error {
		return Run(ctx, []string{"serve"}, w.env("RECONCILER_ADMIN_ADDR", admin, "RECONCILER_INTERVAL", "1s",
			"RECONCILER_ADMIN_TOKENS", "ops:"+operatorToken), &apitest.Logs{})
	})
	report := func() (Report, bool) {
		res := apitest.Do(t, http.MethodGet, base+"/report", "", "Authorization", "Bearer "+operatorToken)
		if res.Status != http.StatusOK {
			require.Equal(t, http.StatusServiceUnavailable, res.Status, "before the first pass: %s", res.Body)
			return Report{}, false
		}
		var r Report
		require.NoError(t, json.Unmarshal(res.Body, &r))
		return r, true
	}
	var r Report
	require.Eventually(t, func() bool { var ok bool; r, ok = report(); return ok }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, map[drift.Class]int{drift.ClassLost: 1}, counts(r))
	require.Equal(t, []string{lost.String()}, r.Classes[drift.ClassLost].Examples)

	// A change, found by an incremental pass.
	orphan := w.addUser(w.doc(), time.Now())
	w.addAnswer(sender, uuid.NewString(), orphan, time.Now())
	require.Eventually(t, func() bool {
		r, _ = report()
		return r.Kind == KindIncremental && r.Classes[drift.ClassOrphanUser].Count == 1
	}, 30*time.Second, 50*time.Millisecond, "an incremental pass finds the orphan")
	require.Equal(t, 1, r.Classes[drift.ClassLost].Count, "and keeps what the full pass found")

	metrics := string(apitest.Do(t, http.MethodGet, base+"/metrics", "").Body)
	for _, line := range []string{
		`reconciler_drift{class="lost"} 1`,
		`reconciler_drift{class="orphan-user"} 1`,
		`reconciler_drift{class="duplicate-document"} 0`,
		`reconciler_drift{class="stuck"} 0`,
		`reconciler_drift_oldest_age_seconds{class="stuck"} 0`,
		`reconciler_pass_failures_total{kind="full"} 0`,
		`reconciler_pass_failures_total{kind="incremental"} 0`,
	} {
		require.Contains(t, metrics, line+"\n")
	}
	for _, name := range []string{
		`reconciler_drift_oldest_age_seconds{class="lost"} `,
		`reconciler_last_pass_timestamp_seconds{kind="full"} `, `reconciler_last_pass_timestamp_seconds{kind="incremental"} `,
		`reconciler_last_pass_duration_seconds{kind="full"} `, `reconciler_last_pass_duration_seconds{kind="incremental"} `,
	} {
		require.Contains(t, metrics, "\n"+name, name)
	}
	require.NotContains(t, metrics, lost.String(), "metrics carry no ids")

	// The image has no curl: the binary asks its own /readyz.
	var out strings.Builder
	require.NoError(t, Run(context.Background(), []string{"healthcheck"}, w.env("RECONCILER_ADMIN_ADDR", admin), &out))
	require.Equal(t, "ready\n", out.String())

	// The report only for a named operator; the Host rule on every route.
	res := apitest.Do(t, http.MethodGet, base+"/report", "")
	require.Equal(t, http.StatusUnauthorized, res.Status)
	require.Equal(t, Realm, res.Header.Get("WWW-Authenticate"))
	res = apitest.Do(t, http.MethodGet, base+"/report", "", "Authorization", "Bearer not-the-operators-token-0123")
	require.Equal(t, http.StatusUnauthorized, res.Status)
	apitest.RequireHostsChecked(t, base, "RECONCILER_ADMIN_ALLOWED_HOSTS", "/report")
}

// TestServeBeforeAnyPassAndWhenADatabaseIsDown: while no pass has finished
// /report says so, /readyz says a database is down, the drift gauges are
// absent rather than zero, and each failed pass is counted.
func TestServeBeforeAnyPassAndWhenADatabaseIsDown(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	admin := apitest.FreeAddr(t)
	base := "http://" + admin
	nowhere := "postgres://reconciler@" + apitest.FreeAddr(t) + "/users?sslmode=disable&connect_timeout=1"
	apitest.RunUntilReady(t, base+"/healthz", func(ctx context.Context) error {
		return Run(ctx, []string{"serve"}, w.env("RECONCILER_ADMIN_ADDR", admin, "RECONCILER_INTERVAL", "1s",
			"RECONCILER_USERS_DATABASE_URL", nowhere, "RECONCILER_ADMIN_TOKENS", "ops:"+operatorToken), &apitest.Logs{})
	})
	require.Equal(t, http.StatusServiceUnavailable, apitest.Do(t, http.MethodGet, base+"/readyz", "").Status)
	// Two or more: a pass fails every second, and on a loaded machine a
	// scrape may come after the third.
	fullFailures := regexp.MustCompile(`\nreconciler_pass_failures_total\{kind="full"\} (\d+)\n`)
	require.Eventually(t, func() bool {
		m := fullFailures.FindStringSubmatch(string(apitest.Do(t, http.MethodGet, base+"/metrics", "").Body))
		if m == nil {
			return false
		}
		n, err := strconv.Atoi(m[1])
		return err == nil && n >= 2
	}, 30*time.Second, 50*time.Millisecond, "failed passes are counted; the next one is full again")
	m := string(apitest.Do(t, http.MethodGet, base+"/metrics", "").Body)
	require.NotContains(t, m, "reconciler_drift{")
	require.NotContains(t, m, "reconciler_last_pass_timestamp_seconds{")
	res := apitest.Do(t, http.MethodGet, base+"/report", "", "Authorization", "Bearer "+operatorToken)
	require.Equal(t, http.StatusServiceUnavailable, res.Status)
	require.Contains(t, res.Problem(t).Detail, "no pass has finished yet")
}
