package main

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const self = "github.com/outboxref/outboxref/outbox-sender/"

// allowed is each of the sender's packages, with the sender's packages it
// may import. Imports run one way, from the top of this list to the
// bottom: the engine knows its seams and nothing behind them, the sources
// and the transport plug into the engine, the operator's tools and
// everything else stand on the store, and only the binary's wiring knows
// every part.
var allowed = map[string][]string{
	".":                 {"sender"},
	"sender":            {"relay", "poll", "cdc", "usershttp", "usersnats", "deadletter", "internal/store"},
	"cdc":               {"relay", "poll", "internal/store"},
	"poll":              {"relay", "internal/store"},
	"usersnats":         {"relay", "answer", "internal/store"},
	"usershttp":         {"relay", "answer", "internal/store"},
	"answer":            {"relay"},
	"deadletter":        {"internal/store"},
	"relay":             {"internal/store"},
	"internal/store":    {"internal/outboxdb"},
	"internal/outboxdb": {},
}

// TestImportsRunOneWay reads the import lines of every package under
// outbox-sender (tests aside) and holds them to allowed.
func TestImportsRunOneWay(t *testing.T) {
	t.Parallel()
	found := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		imports := packageImports(t, path)
		if imports == nil {
			return nil
		}
		found[path] = true
		require.Empty(t, forbidden(path, imports), "outbox-sender/%s imports against the one-way rule", path)
		return nil
	})
	require.NoError(t, err)
	for pkg := range allowed {
		require.True(t, found[pkg], "allowed names %s, which has no Go files: keep the list in step with the folders", pkg)
	}
	for pkg := range found {
		_, ok := allowed[pkg]
		require.True(t, ok, "outbox-sender/%s is a package the one-way rule does not know: add it to allowed", pkg)
	}
}

// TestImportRuleCatchesMistakes proves the check above can fail: the
// engine importing a source, or a source the transport.
func TestImportRuleCatchesMistakes(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"poll"}, forbidden("relay", []string{self + "poll", self + "internal/store", "context"}))
	require.Equal(t, []string{"usershttp"}, forbidden("cdc", []string{self + "usershttp", self + "relay"}))
	require.Empty(t, forbidden("sender", []string{self + "cdc", "github.com/outboxref/outboxref/internal/outbox"}))
}

// forbidden returns the sender's packages among imports that pkg may not
// import. Packages outside the sender are not its concern.
func forbidden(pkg string, imports []string) []string {
	var bad []string
	for _, imp := range imports {
		rel, ok := strings.CutPrefix(imp, self)
		if ok && !slices.Contains(allowed[pkg], rel) {
			bad = append(bad, rel)
		}
	}
	return bad
}

// packageImports returns the imports of the non-test Go files in dir; nil
// when it has none.
func packageImports(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	var imports []string
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			imports = append(imports, path)
		}
		if imports == nil {
			imports = []string{}
		}
	}
	return imports
}
