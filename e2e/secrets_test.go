package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// secretMark is in every secret this test hands a binary; no output may
// contain it.
const secretMark = "Sekr1tMark"

type runFunc func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error

func secret(name string) string { return secretMark + "-" + name + "-0123456789abcdef" }

// TestSecretsNeverLeave sets a recognisable secret in every secret-bearing
// variable of each binary (passwords in URLs, password variables, tokens)
// and runs it the ways that print: a configuration with mistakes, a
// database that cannot be reached, and serving until stopped, with a few
// requests and a metrics scrape. The secret appears in no log line, error,
// answer or metric.
func TestSecretsNeverLeave(t *testing.T) {
	t.Parallel()
	studentDB := pgtest.URL(t, migrations.Student)
	usersDB := pgtest.URL(t, migrations.Users)
	withSecret := func(dbURL, role string) string {
		u, err := url.Parse(dbURL)
		require.NoError(t, err)
		u.User = url.UserPassword(role, secret("url-"+role))
		return u.String()
	}
	tokensFile := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokensFile, []byte("outbox-sender:"+secret("token")+"\n"), 0o600))

	type binary struct {
		name string
		addr string // where it serves
		run  runFunc
		// broken has every secret and at least one mistake; serving is a
		// configuration that runs.
		broken, unreachable, serving map[string]string
		get                          []string // paths asked while serving
		post                         string   // a student to create while serving, if any
		// waitFor, if set, must hold before the binary is stopped.
		waitFor func() bool
	}
	// Each binary serves on an address of its own, so that the three run
	// side by side.
	studentAddr, usersAddr, senderAddr := apitest.FreeAddr(t), apitest.FreeAddr(t), apitest.FreeAddr(t)
	// A Users that refuses every credential, so that the sender's loud
	// misconfiguration line, which names Users' URL, is part of the output.
	var refusals atomic.Int64
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		refusals.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(refusing.Close)
	refusingURL, err := url.Parse(refusing.URL)
	require.NoError(t, err)
	refusingURL.User = url.UserPassword("u", secret("users-url"))
	binaries := []binary{
		{
			name: "student", addr: studentAddr, run: studentsvc.Run,
			broken: map[string]string{
				"STUDENT_DATABASE_URL":              withSecret(studentDB, migrations.StudentApp),
				"STUDENT_DATABASE_PASSWORD":         secret("pw"),
				"STUDENT_MIGRATE_DATABASE_URL":      "postgres://admin:" + secret("admin") + "@[bad",
				"STUDENT_MIGRATE_DATABASE_PASSWORD": secret("admin-pw"),
				"SENDER_DATABASE_PASSWORD":          secret("sender-pw"),
				"SENDER_DATABASE_PASSWORD_FILE":     "/nonexistent/" + "x",
				"STUDENT_API_TOKENS":                "client:" + secret("student-token"),
				"LOG_LEVEL":                         "loud",
			},
			unreachable: map[string]string{
				"STUDENT_DATABASE_URL":      "postgres://student_app@127.0.0.1:1/student?connect_timeout=2",
				"STUDENT_DATABASE_PASSWORD": secret("pw"),
			},
			serving: map[string]string{
				"STUDENT_DATABASE_URL": pgtest.RoleURL(t, studentDB, migrations.StudentApp),
				"STUDENT_HTTP_ADDR":    studentAddr,
				"STUDENT_ADMIN_ADDR":   apitest.FreeAddr(t),
				"STUDENT_API_TOKENS":   "client:" + secret("student-token"),
			},
			get:  []string{"/students", "/students/00000000-0000-0000-0000-000000000000", "/readyz", "/nope"},
			post: `{"name":"Ada Lovelace","email":"ada@example.com","document_number":"SECRETS-1"}`,
		},
		{
			name: "users", addr: usersAddr, run: usersvc.Run,
			broken: map[string]string{
				"USERS_DATABASE_URL":         withSecret(usersDB, migrations.UsersApp),
				"USERS_DATABASE_PASSWORD":    secret("pw"),
				"USERS_MIGRATE_DATABASE_URL": "postgres://admin:" + secret("admin") + "@[bad",
				"USERS_API_TOKENS":           "outbox-sender:" + secret("token"),
				"USERS_API_TOKENS_FILE":      tokensFile,
				"LOG_LEVEL":                  "loud",
			},
			unreachable: map[string]string{
				"USERS_DATABASE_URL":      "postgres://users_app@127.0.0.1:1/users?connect_timeout=2",
				"USERS_DATABASE_PASSWORD": secret("pw"),
				"USERS_API_TOKENS":        "outbox-sender:" + secret("token"),
			},
			serving: map[string]string{
				"USERS_DATABASE_URL":    pgtest.RoleURL(t, usersDB, migrations.UsersApp),
				"USERS_API_TOKENS_FILE": tokensFile,
				"USERS_HTTP_ADDR":       usersAddr,
				"USERS_ADMIN_ADDR":      apitest.FreeAddr(t),
			},
			get: []string{"/users/00000000-0000-0000-0000-000000000000", "/readyz", "/nope"},
		},
		{
			name: "outbox-sender", addr: senderAddr, run: sender.Run,
			broken: map[string]string{
				"SENDER_DATABASE_URL":      withSecret(studentDB, migrations.OutboxSender),
				"SENDER_DATABASE_PASSWORD": secret("pw"),
				"SENDER_USERS_URL":         "ftp://u:" + secret("users-url") + "@users",
				"SENDER_USERS_TOKEN":       secret("token"),
				"SENDER_USERS_TOKEN_FILE":  tokensFile,
				"LOG_LEVEL":                "loud",
			},
			unreachable: map[string]string{
				"SENDER_DATABASE_URL":      "postgres://outbox_sender@127.0.0.1:1/student?connect_timeout=2",
				"SENDER_DATABASE_PASSWORD": secret("pw"),
				"SENDER_USERS_TOKEN":       secret("token"),
			},
			serving: map[string]string{
				"SENDER_DATABASE_URL": pgtest.RoleURL(t, studentDB, migrations.OutboxSender),
				"SENDER_USERS_URL":    refusingURL.String(),
				"SENDER_USERS_TOKEN":  secret("token"),
				"SENDER_ADMIN_ADDR":   senderAddr,
			},
			get:     []string{"/metrics", "/dead-letters", "/readyz", "/nope"},
			waitFor: func() bool { return refusals.Load() > 0 },
		},
	}
	for _, b := range binaries {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			check := func(what string, out string, err error) {
				t.Helper()
				if err != nil {
					out += "\n" + err.Error()
				}
				require.NotContains(t, out, secretMark, "%s: a secret leaked", what)
			}

			var out apitest.Logs
			err := b.run(context.Background(), nil, lookup(b.broken), &out)
			require.Error(t, err, "a broken configuration must not start")
			check("broken configuration", out.String(), err)

			for _, args := range [][]string{nil, {"migrate"}} {
				// Serving goes on without its database (readiness says so)
				// until stopped; migrate fails.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				var out apitest.Logs
				err := b.run(ctx, args, lookup(b.unreachable), &out)
				cancel()
				if len(args) > 0 {
					require.Error(t, err, "%v: the database cannot be reached", args)
				}
				check(fmt.Sprintf("unreachable database, args %v", args), out.String(), err)
			}

			// Serving logs in with the role's real password (the cluster
			// may check it); the marked secrets here are the tokens and the
			// password in the sender's Users URL.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var logs apitest.Logs
			done := make(chan error, 1)
			go func() { done <- b.run(ctx, nil, lookup(b.serving), &logs) }()
			deadline := time.Now().Add(10 * time.Second)
			var bodies strings.Builder
			for _, path := range b.get {
				for time.Now().Before(deadline) {
					resp, err := http.Get("http://" + b.addr + path)
					if err != nil {
						time.Sleep(100 * time.Millisecond)
						continue
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					bodies.Write(body)
					break
				}
			}
			if b.post != "" {
				req, err := http.NewRequest(http.MethodPost, "http://"+b.addr+"/students", strings.NewReader(b.post))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+secret("student-token"))
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
				bodies.Write(body)
			}
			if b.waitFor != nil {
				require.Eventually(t, b.waitFor, 10*time.Second, 50*time.Millisecond, "the binary did not reach the path under test")
				time.Sleep(200 * time.Millisecond) // let the log line that follows the answer be written
			}
			cancel()
			select {
			case err := <-done:
				check("serving", logs.String()+bodies.String(), err)
			case <-time.After(30 * time.Second):
				t.Fatal("the binary did not stop within 30s of its context ending")
			}
		})
	}
}

func lookup(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}
