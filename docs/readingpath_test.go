package docs

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// The README's reading path is a learner's way through the code: at most
// maxStops stops, each a function or a SQL statement of at most
// maxStopLines lines, so that each can be read in one go. These tests hold
// it to the code, so that a stop cannot point at something renamed, moved
// or grown too long.

const (
	maxStops     = 10
	maxStopLines = 60
)

// stop is one item of the reading path: a file and the functions or
// statements in it to read.
type stop struct {
	item  string // the list item, for messages
	file  string
	names []string
}

// stopItem marks a numbered item of the list, and stopRef finds in it
// what the item names, as in
//
//  3. `db/queries/outbox/outbox.sql:ClaimDue`: …
//  5. `outbox-sender/usershttp/usershttp.go:Deliver` and `judge`: …
//
// its first file:name, then the names that follow it as "and `name`".
var (
	stopItem = regexp.MustCompile(`^\d+\. `)
	stopRef  = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.(?:go|sql)):([A-Za-z_][A-Za-z0-9_]*)`((?: and `[A-Za-z_][A-Za-z0-9_]*`)*)")
	andName  = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*)`")
)

// readingPath reads the stops of the README's ## Reading path section.
func readingPath(readme string) ([]stop, error) {
	_, section, found := strings.Cut(readme, "\n## Reading path\n")
	if !found {
		return nil, errors.New("the README has no ## Reading path section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var stops []stop
	for line := range strings.SplitSeq(section, "\n") {
		if !stopItem.MatchString(line) {
			continue
		}
		m := stopRef.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("reading path item names no `file.go:Name` or `file.sql:Name`: %s", line)
		}
		s := stop{item: line, file: m[1], names: []string{m[2]}}
		for _, n := range andName.FindAllStringSubmatch(m[3], -1) {
			s.names = append(s.names, n[1])
		}
		stops = append(stops, s)
	}
	return stops, nil
}

// definition returns the text of the function name in a Go file, or of
// the statement name in a SQL file: a sqlc query (-- name: Name) up to
// its semicolon, or the table CREATE TABLE name (or public.name).
func definition(fsys fs.FS, file, name string) (string, error) {
	src, err := fs.ReadFile(fsys, file)
	if err != nil {
		return "", err
	}
	text := string(src)
	switch path.Ext(file) {
	case ".go":
		f, err := parser.ParseFile(token.NewFileSet(), file, src, parser.SkipObjectResolution)
		if err != nil {
			return "", err
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == name {
				return text[fn.Pos()-f.FileStart : fn.End()-f.FileStart], nil
			}
		}
	case ".sql":
		// A migration names its tables bare; a schema snapshot (db/schema,
		// pg_dump's) names them in their schema.
		for _, start := range []string{"-- name: " + name + " ", "CREATE TABLE " + name + " (", "CREATE TABLE public." + name + " ("} {
			if i := strings.Index(text, start); i >= 0 {
				end := statementEnd(text[i:])
				if end < 0 {
					return "", fmt.Errorf("%s: %s has no end", file, name)
				}
				return text[i : i+end+1], nil
			}
		}
	}
	return "", fmt.Errorf("%s defines no %s", file, name)
}

// statementEnd is the index of the semicolon that ends the SQL statement
// text starts with, or -1: the first one outside a comment or a quoted
// string (a query's comment may well hold one).
func statementEnd(text string) int {
	for i := 0; i < len(text); i++ {
		switch {
		case text[i] == ';':
			return i
		case strings.HasPrefix(text[i:], "--"):
			n := strings.IndexByte(text[i:], '\n')
			if n < 0 {
				return -1
			}
			i += n
		case strings.HasPrefix(text[i:], "/*"):
			n := strings.Index(text[i:], "*/")
			if n < 0 {
				return -1
			}
			i += n + 1
		case text[i] == '\'' || text[i] == '"':
			n := strings.IndexByte(text[i+1:], text[i])
			if n < 0 {
				return -1
			}
			i += n + 1
		}
	}
	return -1
}

// stopProblems says what is wrong with the reading path against fsys.
func stopProblems(fsys fs.FS, stops []stop) []string {
	var wrong []string
	if len(stops) == 0 || len(stops) > maxStops {
		wrong = append(wrong, fmt.Sprintf("the reading path has %d stops; it must have 1 to %d", len(stops), maxStops))
	}
	for _, s := range stops {
		for _, name := range s.names {
			def, err := definition(fsys, s.file, name)
			if err != nil {
				wrong = append(wrong, fmt.Sprintf("%v (in %q)", err, s.item))
				continue
			}
			if n := strings.Count(def, "\n") + 1; n > maxStopLines {
				wrong = append(wrong, fmt.Sprintf("%s:%s is %d lines, more than a stop may be (%d)", s.file, name, n, maxStopLines))
			}
		}
	}
	return wrong
}

// TestReadingPath: every stop exists and is short, and the first claim a
// learner reads teaches SKIP LOCKED and the lease alone: the filter that
// leaves new rows to a change-data-capture stream, and the claim's commit
// setting, are taught where change data capture and the store are.
func TestReadingPath(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(path.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	stops, err := readingPath(string(readme))
	require.NoError(t, err)
	fsys := os.DirFS(repoRoot)
	require.Empty(t, stopProblems(fsys, stops))

	var claim string
	for _, s := range stops {
		if strings.HasSuffix(s.file, ".sql") && s.names[0] == "ClaimDue" {
			claim, err = definition(fsys, s.file, "ClaimDue")
			require.NoError(t, err)
		}
	}
	require.NotEmpty(t, claim, "the reading path shows the claim (ClaimDue)")
	require.Contains(t, claim, "FOR UPDATE SKIP LOCKED")
	require.Contains(t, claim, "@lease")
	for _, elsewhere := range []string{"leave_new", "synchronous_commit"} {
		require.NotContains(t, claim, elsewhere, "the first claim a learner reads teaches SKIP LOCKED and the lease alone")
	}
}

// TestReadingPathCheckCatchesMistakes proves the checks above can fail: a
// name that is not defined, a stop that grew too long, too many stops.
func TestReadingPathCheckCatchesMistakes(t *testing.T) {
	t.Parallel()
	long := "package x\n\nfunc long() {\n" + strings.Repeat("\t_ = 1\n", maxStopLines) + "}\n\nfunc short() {}\n"
	fsys := fstest.MapFS{
		"x/x.go":     {Data: []byte(long)},
		"q/q.sql":    {Data: []byte("-- name: Claim :many\nSELECT 1\nFROM t;\n\nCREATE TABLE things (\n    id int\n);\n")},
		"q/semi.sql": {Data: []byte("-- name: Semi :one\n-- A comment; a semicolon.\nSELECT ';' /* ; */\nFROM t;\n")},
		"README.md":  {Data: []byte("# x\n\n## Reading path\n\n1. `x/x.go:short` and `long`: two.\n2. `q/q.sql:Claim`: a query.\n3. `q/q.sql:things`: a table.\n4. `x/x.go:gone`: missing.\n\n## Next\n")},
	}
	semi, err := definition(fsys, "q/semi.sql", "Semi")
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(semi, "FROM t;"), "a semicolon in a comment or a string ends no statement: %q", semi)
	readme, err := fs.ReadFile(fsys, "README.md")
	require.NoError(t, err)
	stops, err := readingPath(string(readme))
	require.NoError(t, err)
	require.Len(t, stops, 4)
	require.Equal(t, []string{"short", "long"}, stops[0].names)
	wrong := stopProblems(fsys, stops)
	require.Len(t, wrong, 2, "%v", wrong)
	require.Contains(t, wrong[0], "x/x.go:long is 62 lines")
	require.Contains(t, wrong[1], "x/x.go defines no gone")

	var many []stop
	for range maxStops + 1 {
		many = append(many, stops[1])
	}
	require.Contains(t, stopProblems(fsys, many)[0], "11 stops")
	_, err = readingPath("# x\n\n## Reading path\n\n1. read the code.\n")
	require.ErrorContains(t, err, "names no")
}
