package outbox_test

import (
	"context"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestWordsMatchTheTable: the states and operations the code names are the
// ones the outbox table's CHECK constraints allow, no more and no fewer. A
// state added to one and not the other would be refused by the database, or
// never written.
func TestWordsMatchTheTable(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	allowed := func(column string) []string {
		var def string
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
			WHERE c.conrelid = 'outbox'::regclass AND c.contype = 'c'
			  AND c.conkey = ARRAY[(SELECT attnum FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = $1)]`,
			column).Scan(&def))
		var words []string
		for _, m := range regexp.MustCompile(`'([^']*)'::text`).FindAllStringSubmatch(def, -1) {
			words = append(words, m[1])
		}
		require.NotEmpty(t, words, "the CHECK constraint on outbox.%s lists no words: %s", column, def)
		return words
	}
	require.ElementsMatch(t, outbox.States, allowed("state"))
	require.ElementsMatch(t, []string{outbox.OperationCreateUser}, allowed("operation"))
}

// TestReasonClassesAreDistinct: each class is one word with one meaning.
func TestReasonClassesAreDistinct(t *testing.T) {
	t.Parallel()
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(outbox.ReasonClasses))), len(outbox.ReasonClasses))
	for _, class := range outbox.NewKeySafe {
		require.Contains(t, outbox.ReasonClasses, class)
		require.True(t, outbox.IsNewKeySafe(class))
	}
	require.False(t, outbox.IsNewKeySafe(outbox.ReasonExpired), "an expired key may have created the user")
	for _, class := range outbox.NewKeySafe {
		require.Contains(t, outbox.DeadClasses, class)
	}
	// Every class is retried, dead, or both.
	require.ElementsMatch(t, outbox.ReasonClasses, slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(outbox.RetryClasses), outbox.DeadClasses...)))))
}
