package e2e

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
)

// TestReadmeDocumentsEveryVariable keeps the README's configuration tables
// and the binaries in step: every variable a binary reads has a row, and
// every row names a variable some binary reads.
func TestReadmeDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	rows := regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\|").FindAllSubmatch(readme, -1)
	var documented []string
	for _, m := range rows {
		documented = append(documented, string(m[1]))
	}

	none := func(string) string { return "" }
	var read []string
	for _, load := range []func(func(string) string) *envconfig.Reader{
		func(g func(string) string) *envconfig.Reader { _, r, _ := studentsvc.LoadConfig(g); return r },
		func(g func(string) string) *envconfig.Reader { _, r, _ := usersvc.LoadConfig(g); return r },
		func(g func(string) string) *envconfig.Reader { _, r, _ := sender.LoadConfig(g); return r },
	} {
		read = append(read, load(none).Names()...)
	}
	slices.Sort(read)
	read = slices.Compact(read)
	slices.Sort(documented)
	documented = slices.Compact(documented)
	require.NotEmpty(t, documented, "no configuration rows found in the README")
	require.Equal(t, read, documented, "README configuration tables vs variables the binaries read")
}
