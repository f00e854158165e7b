package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// The inbox table is defined twice, once in each database's migrations
// (db/migrations/student and db/migrations/users: migrations already
// applied are never rewritten), while one package runs the same statements
// on both (internal/inbox, db/queries/inbox). sqlc checks those statements
// against both schemas (sqlc.yaml, make check-generated); this test holds
// the two tables themselves together.

// inboxTable describes the inbox table of a database: each column (name,
// position, type, nullability, default), each index and each constraint,
// as PostgreSQL reports them after the migrations ran.
func inboxTable(t *testing.T, pool *pgxpool.Pool) (columns, indexes, constraints []string) {
	t.Helper()
	ctx := context.Background()
	read := func(sql string) []string {
		rows, err := pool.Query(ctx, sql)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NotEmpty(t, out, "%s found nothing", sql)
		return out
	}
	columns = read(`
		SELECT format('%s %s %s %s nullable=%s default=%s', ordinal_position, column_name, data_type,
		              coalesce(character_maximum_length::text, ''), is_nullable, coalesce(column_default, 'none'))
		FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'inbox' ORDER BY ordinal_position`)
	indexes = read(`SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'inbox' ORDER BY indexdef`)
	constraints = read(`
		SELECT format('%s %s %s', conname, contype, pg_get_constraintdef(oid))
		FROM pg_constraint WHERE conrelid = 'public.inbox'::regclass ORDER BY conname`)
	return columns, indexes, constraints
}

// TestInboxTablesAreIdentical: Student's inbox and Users' are the same
// table, column by column, index by index, constraint by constraint.
func TestInboxTablesAreIdentical(t *testing.T) {
	t.Parallel()
	sc, si, sk := inboxTable(t, pgtest.Pool(t, migrations.Student))
	uc, ui, uk := inboxTable(t, pgtest.Pool(t, migrations.Users))
	require.Equal(t, uc, sc, "the inbox's columns in Users' database (expected) and Student's (actual)")
	require.Equal(t, ui, si, "the inbox's indexes in Users' database (expected) and Student's (actual)")
	require.Equal(t, uk, sk, "the inbox's constraints in Users' database (expected) and Student's (actual)")
	require.Contains(t, sk, "inbox_pkey p PRIMARY KEY (caller, idempotency_key)", "the key is scoped per caller in both")
}
