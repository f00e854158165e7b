package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadQueries loads the real query files: every statement the bound runs
// must be there, with the parameters it binds, and numbered as sqlc numbers
// them. It fails when a query the bench needs is renamed, removed or changes
// its parameters, so the bound cannot drift from the services unnoticed.
func TestLoadQueries(t *testing.T) {
	t.Parallel()
	root, err := repoRoot()
	require.NoError(t, err)
	qs, err := loadQueries(root)
	require.NoError(t, err)
	for name, params := range neededQueries {
		require.Contains(t, qs, name)
		require.Equal(t, params, qs[name].params, name)
	}
	for name, q := range qs {
		require.NotContains(t, q.sql, "@", "%s: a parameter left unnumbered", name)
		require.NotContains(t, q.sql, "sqlc.", "%s: a parameter left unnumbered", name)
		require.NotContains(t, q.sql, "-- name:", name)
		require.False(t, strings.HasSuffix(q.sql, ";"), name)
	}
	// One statement in full, as sqlc would send it.
	require.Contains(t, qs["ClaimDue"].sql, "available_at = now() + $1::interval")
	require.Contains(t, qs["ClaimDue"].sql, "LIMIT $3")
	require.Contains(t, qs["ClaimDue"].sql, "(o.age_from + $4::interval < now())::boolean AS expired")
	require.NotContains(t, qs["RecordEvents"].sql, "One statement for a whole batch")
}

func TestNumberParams(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in, want string
		params   []string
	}{
		{"SELECT @a, @b::int, @a", "SELECT $1, $2::int, $1", []string{"a", "b"}},
		{"SELECT sqlc.arg(x), sqlc.narg('y'), sqlc.arg(x)", "SELECT $1, $2, $1", []string{"x", "y"}},
		{"SELECT '@not', \"@nor\", @yes", "SELECT '@not', \"@nor\", $1", []string{"yes"}},
		{"SELECT 'it''s @not' || @p", "SELECT 'it''s @not' || $1", []string{"p"}},
		{"SELECT mysqlc.arg(x)", "SELECT mysqlc.arg(x)", nil},
	} {
		got, params, err := numberParams(tt.in)
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, got, tt.in)
		require.Equal(t, tt.params, params, tt.in)
	}
	_, _, err := numberParams("SELECT 'open")
	require.Error(t, err)
}

func TestQueryArgs(t *testing.T) {
	t.Parallel()
	q := query{name: "Q", params: []string{"a", "b"}}
	args, err := q.args(map[string]any{"b": 2, "a": 1})
	require.NoError(t, err)
	require.Equal(t, []any{1, 2}, args)
	_, err = q.args(map[string]any{"a": 1})
	require.Error(t, err)
	_, err = q.args(map[string]any{"a": 1, "c": 3})
	require.Error(t, err)
}
