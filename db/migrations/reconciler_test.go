package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// reconcilerColumns are the columns the reconciler may read, by table: what
// its checks need (reconciler/internal's queries), and no more.
var reconcilerColumns = map[migrations.Set]map[string][]string{
	migrations.Student: {
		"students": {"created_at", "document_number", "id", "user_id"},
		"outbox":   {"created_at", "dead_at", "id", "idempotency_key", "operation", "reason_class", "state", "state_at", "student_id"},
	},
	migrations.Users: {
		"users": {"created_at", "document_number", "enabled", "id"},
		"inbox": {"caller", "created_at", "idempotency_key", "resource_id", "status_code"},
	},
}

// TestReconcilerReadsItsColumnsAndChangesNothing: on each database the
// reconciler's role holds SELECT on exactly reconcilerColumns; reading any
// other column of any table is refused, and so is every write to every
// table (INSERT, UPDATE, DELETE, TRUNCATE), even with its sessions'
// read-only default turned off.
func TestReconcilerReadsItsColumnsAndChangesNothing(t *testing.T) {
	t.Parallel()
	for _, set := range []migrations.Set{migrations.Student, migrations.Users} {
		t.Run(string(set), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dbURL := pgtest.URL(t, set)
			admin := connect(t, dbURL)
			var granted []string
			rows, err := admin.Query(ctx, `SELECT table_name || '.' || column_name || ' ' || privilege_type
				FROM information_schema.column_privileges WHERE grantee = $1 ORDER BY 1`, migrations.Reconciler)
			require.NoError(t, err)
			granted, err = pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			var want []string
			for table, cols := range reconcilerColumns[set] {
				for _, c := range cols {
					want = append(want, table+"."+c+" SELECT")
				}
			}
			slices.Sort(want)
			require.Equal(t, want, granted, "the reconciler's column grants")

			conn := connect(t, pgtest.RoleURL(t, dbURL, migrations.Reconciler))
			require.Equal(t, "25006", sqlState(inRolledBackTx(conn, `CREATE TABLE t (x int)`)), "read-only by default")
			_, err = conn.Exec(ctx, "SET default_transaction_read_only = off")
			require.NoError(t, err)

			rows, err = admin.Query(ctx, `SELECT c.table_name, c.column_name, c.is_identity = 'NO' AND c.is_generated = 'NEVER'
				FROM information_schema.columns c
				JOIN pg_tables p ON p.tablename = c.table_name AND p.schemaname = c.table_schema
				WHERE c.table_schema = 'public' ORDER BY c.table_name, c.ordinal_position`)
			require.NoError(t, err)
			type column struct {
				table, name string
				writable    bool // not an identity or generated column, so an UPDATE may set it
			}
			columns, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (column, error) {
				var c column
				return c, row.Scan(&c.table, &c.name, &c.writable)
			})
			require.NoError(t, err)
			tables := map[string]string{} // table → its first writable column
			for _, c := range columns {
				if _, ok := tables[c.table]; !ok && c.writable {
					tables[c.table] = c.name
				}
				sql := fmt.Sprintf("SELECT %s FROM %s", c.name, c.table)
				if slices.Contains(reconcilerColumns[set][c.table], c.name) {
					require.NoError(t, inRolledBackTx(conn, sql), "the reconciler reads %s.%s", c.table, c.name)
				} else {
					require.Equal(t, "42501", sqlState(inRolledBackTx(conn, sql)), "the reconciler must not read %s.%s", c.table, c.name)
				}
			}
			require.Contains(t, tables, "goose_db_version", "every table, goose's too")
			for table, first := range tables {
				for _, sql := range []string{
					"INSERT INTO " + table + " DEFAULT VALUES",
					fmt.Sprintf("UPDATE %s SET %s = %s", table, first, first),
					"DELETE FROM " + table,
					"TRUNCATE " + table,
				} {
					require.Equal(t, "42501", sqlState(inRolledBackTx(conn, sql)), "the reconciler must not: %s", sql)
				}
			}
			for _, sql := range append([]string{`SET ROLE ` + set.Owner(), wake}, ddl...) {
				require.Equal(t, "42501", sqlState(inRolledBackTx(conn, sql)), "the reconciler must not: %s", sql)
			}
		})
	}
}
