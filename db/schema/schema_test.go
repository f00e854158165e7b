// Package schema holds no code: this folder's student.sql and users.sql are
// each database's schema after every migration (testkit/schemadump makes
// them), and this test keeps them fresh.
package schema

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/pgtest"
	"github.com/outboxref/outboxref/testkit/schemadump"
)

// TestSnapshotsAreFresh makes each snapshot again, from the migrations on
// a fresh database of the test server, and fails when the committed file
// differs: a migration was added or changed without `make schema`.
func TestSnapshotsAreFresh(t *testing.T) {
	t.Parallel()
	for _, set := range schemadump.Sets {
		t.Run(string(set), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			fresh, err := schemadump.Snapshot(ctx, pgtest.EmptyURL(t), set, pgtest.Passwords)
			require.NoError(t, err)

			path := filepath.ToSlash(filepath.Join(schemadump.Dir, schemadump.File(set)))
			committed, err := os.ReadFile(schemadump.File(set))
			require.NoError(t, err, "%s is missing: run '%s' and commit it", path, schemadump.Command)
			if diff := schemadump.Diff(committed, fresh); diff != "" {
				bin, _ := schemadump.PgDumpPath()
				t.Fatalf("%s is stale (or was made by another pg_dump than %s): run '%s' and commit it\n%s",
					path, bin, schemadump.Command, diff)
			}
		})
	}
}
