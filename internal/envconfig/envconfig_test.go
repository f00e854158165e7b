package envconfig

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestEveryMistakeAtOnce: one start-up attempt shows every bad variable.
func TestEveryMistakeAtOnce(t *testing.T) {
	t.Parallel()
	r := New(env("A_INT", "many", "A_WAIT", "forever", "A_LEVEL", "loud"))
	r.Int("A_INT", 1, 0, 10)
	r.Duration("A_WAIT", time.Second, 0, time.Hour)
	r.OneOf("A_LEVEL", "info", "info", "debug")
	r.Check(false, "A_WAIT must be shorter than A_OTHER")
	err := r.Err()
	for _, name := range []string{"A_INT", "A_WAIT=", "A_LEVEL", "A_OTHER"} {
		require.ErrorContains(t, err, name)
	}
}

// TestDatabaseURLIsNeverEchoed: a password can sit in the userinfo or in
// the query; no error shows either.
func TestDatabaseURLIsNeverEchoed(t *testing.T) {
	t.Parallel()
	for _, v := range []string{
		"mysql://app:hunter2@db/x",
		"mysql://db/x?password=hunter2",
		"postgres://app:hunter2@db:5432/x?sslmode=%zz",
		"postgres://app:hunter2@db:5432/x?sslmode=sometimes",
		"://app:hunter2@",
		"postgres://app:hunter2%zz@db:5432/x",
		"postgres://app:hunter2@db:54x2/x",
	} {
		r := New(env("DB_URL", v))
		r.DatabaseURL("DB_URL", "postgres://localhost/db")
		require.ErrorContains(t, r.Err(), "DB_URL", v)
		require.NotContains(t, r.Err().Error(), "hunter2", v)
	}
	r := New(env("DB_URL", "postgres://app:hunter2@db:5432/x?sslmode=disable"))
	require.Equal(t, "postgres://app:hunter2@db:5432/x?sslmode=disable", r.DatabaseURL("DB_URL", ""))
	require.NoError(t, r.Err())
}

// TestURLMistakesNameTheirPart: a bad port is blamed on the port, a bad
// scheme on the scheme, for database URLs and others alike.
func TestURLMistakesNameTheirPart(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]string{
		"postgres://app:hunter2@db:54x2/x":  `invalid port ":54x2"`,
		"postgres://app:hunter2@db:99999/x": `the port "99999" is not a number from 1 to 65535`,
		"postgres://app:hunter2@db:0/x":     `the port "0" is not a number from 1 to 65535`,
		"mysql://app:hunter2@db:5432/x":     `not "mysql"`,
		"postgres://app:hunter2%zz@db:1/x":  "does not parse",
		"postgres:///x":                     "", // a path alone: the socket pgx defaults to
	} {
		r := New(env("DB_URL", v))
		r.DatabaseURL("DB_URL", "postgres://localhost/db")
		if want == "" {
			require.NoError(t, r.Err(), v)
			continue
		}
		require.ErrorContains(t, r.Err(), want, v)
		if want != `not "mysql"` {
			require.NotContains(t, r.Err().Error(), "scheme", v)
		}
	}
	r := New(env("USERS_URL", "http://users:80x1"))
	r.URL("USERS_URL", "http://localhost:8081", "http", "https")
	require.ErrorContains(t, r.Err(), `invalid port ":80x1"`)
	require.NotContains(t, r.Err().Error(), "scheme")
}

func TestDefaultsAreRecorded(t *testing.T) {
	t.Parallel()
	computed := 0
	r := New(env("B_ID", "given"))
	r.Duration("B_WAIT", 5*time.Second, 0, time.Hour)
	r.Int("B_N", 3, 0, 10)
	require.Equal(t, "given", r.Computed("B_ID", "hostname-pid", func() string { computed++; return "x" }))
	require.Zero(t, computed, "a default is computed only when needed")
	require.Equal(t, []Var{{"B_WAIT", 5 * time.Second}, {"B_N", 3}, {"B_ID", "hostname-pid"}}, r.Vars())
	require.Equal(t, []string{"B_WAIT", "B_N", "B_ID"}, r.Names())
}

// TestSecretFromVariableOrFile: a secret comes from NAME or NAME_FILE, never
// both, and no error shows its value.
func TestSecretFromVariableOrFile(t *testing.T) {
	t.Parallel()
	file := t.TempDir() + "/pw"
	require.NoError(t, os.WriteFile(file, []byte("s3cret-from-file\n"), 0o600))

	r := New(env("A_PASSWORD_FILE", file))
	require.Equal(t, "s3cret-from-file", r.Secret("A_PASSWORD"))
	require.NoError(t, r.Err())

	r = New(env("A_PASSWORD", "s3cret-inline"))
	require.Equal(t, "s3cret-inline", r.Secret("A_PASSWORD"))
	require.NoError(t, r.Err())

	r = New(env("A_PASSWORD", "s3cret-inline", "A_PASSWORD_FILE", file))
	r.Secret("A_PASSWORD")
	require.ErrorContains(t, r.Err(), "A_PASSWORD and A_PASSWORD_FILE are both set")
	require.NotContains(t, r.Err().Error(), "s3cret")

	r = New(env("A_PASSWORD_FILE", file+".missing"))
	r.Secret("A_PASSWORD")
	require.ErrorContains(t, r.Err(), "A_PASSWORD_FILE=")

	r = New(env())
	r.Require("A_PASSWORD", r.Secret("A_PASSWORD"), "the role has no other way in")
	require.ErrorContains(t, r.Err(), "A_PASSWORD (or A_PASSWORD_FILE) is required")
}

// TestDatabaseLogin: the password goes into the URL from its own variable
// or file, escaped; in both the URL and the variable is an error that shows
// neither.
func TestDatabaseLogin(t *testing.T) {
	t.Parallel()
	file := t.TempDir() + "/pw"
	require.NoError(t, os.WriteFile(file, []byte("p@ss:w/rd\n"), 0o600))

	r := New(env("DB_PASSWORD_FILE", file))
	u, pw := r.DatabaseLogin("DB_URL", "postgres://app@db:5432/x?sslmode=disable", "DB_PASSWORD")
	require.NoError(t, r.Err())
	require.Equal(t, "p@ss:w/rd", pw)
	require.Equal(t, "postgres://app:p%40ss%3Aw%2Frd@db:5432/x?sslmode=disable", u)
	require.Equal(t, []string{"DB_URL", "DB_PASSWORD", "DB_PASSWORD_FILE"}, r.Names())

	r = New(env("DB_URL", "postgres://app:inline@db/x"))
	u, pw = r.DatabaseLogin("DB_URL", "", "DB_PASSWORD")
	require.NoError(t, r.Err())
	require.Empty(t, pw, "only a password from the variable is returned")
	require.Equal(t, "postgres://app:inline@db/x", u)

	r = New(env("DB_URL", "postgres://app:hunter2@db/x", "DB_PASSWORD", "s3cret"))
	r.DatabaseLogin("DB_URL", "", "DB_PASSWORD")
	require.ErrorContains(t, r.Err(), "DB_URL has a password and DB_PASSWORD (or DB_PASSWORD_FILE) is set")
	require.NotContains(t, r.Err().Error(), "hunter2")
	require.NotContains(t, r.Err().Error(), "s3cret")
}

// TestURLList: each URL of a list is checked, named by its place, and
// never echoed; an unset list with no default is none.
func TestURLList(t *testing.T) {
	t.Parallel()
	r := New(env())
	require.Empty(t, r.URLList("NATS_URL", "", "nats"))
	require.NoError(t, r.Err())

	r = New(env("NATS_URL", "nats://a:4222, nats://b:4222"))
	require.Equal(t, "nats://a:4222, nats://b:4222", r.URLList("NATS_URL", "", "nats"))
	require.NoError(t, r.Err())

	r = New(env("NATS_URL", "nats://a:4222,http://u:hunter2@b:4222,nats://c:42x2"))
	r.URLList("NATS_URL", "", "nats")
	require.ErrorContains(t, r.Err(), `NATS_URL: URL 2 of the list: want an absolute URL with scheme [nats], not "http"`)
	require.ErrorContains(t, r.Err(), `NATS_URL: URL 3 of the list: not a URL: invalid port ":42x2"`)
	require.NotContains(t, r.Err().Error(), "hunter2")
}
