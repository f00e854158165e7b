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
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// The README's reading path is a learner's way through the code: at most
// maxStops stops, each naming the functions or SQL statements that do the
// work, none of them longer than maxStopLines lines, so that each can be
// read in one go. Each stop states, as "(about N lines)", what it asks a
// reader to read: what it names, with their comments, what that calls in
// its own package, and the SQL it runs (readingcount_test.go counts it).
// These tests hold the path to the code, so that a stop cannot point at
// something renamed, moved or grown too long, nor its figure drift from
// what is there to read.

const (
	maxStops     = 10
	maxStopLines = 60
	// figureSlack is how far a stop's figure may overstate what it asks
	// for: this many lines, or a quarter of them if that is more.
	figureSlack = 15
)

// stop is one item of the reading path: the functions or statements to
// read, and the figure the README states for them.
type stop struct {
	item string // the list item, for messages
	// opening is a Go file whose opening comment the stop asks for first,
	// as "after the opening comment of `file.go`", if any.
	opening string
	refs    []ref
	// figure is the lines the item says it asks a reader to read, as
	// "(about N lines)"; 0 if it says none.
	figure int
}

// ref is a file and the functions or statements in it that a stop names.
type ref struct {
	file  string
	names []string
}

// stopItem marks a numbered item of the list, and stopRef finds in it
// what the item names, as in
//
//  3. `db/queries/outbox/outbox.sql:ClaimDue`: …
//  5. `outbox-sender/usershttp/usershttp.go:Deliver` and `judge`, then `outbox-sender/answer/answer.go:Judge`: …
//
// each file:name, then the names in the same file that follow it as
// "and `name`". stopFigure finds the lines the item states, and pathTotal
// the lines the section's opening states for the whole path.
var (
	stopItem   = regexp.MustCompile(`^\d+\. `)
	stopRef    = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.(?:go|sql)):([A-Za-z_][A-Za-z0-9_]*)`((?: and `[A-Za-z_][A-Za-z0-9_]*`)*)")
	andName    = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*)`")
	openingOf  = regexp.MustCompile("opening comment of `([A-Za-z0-9_./-]+\\.go)`")
	stopFigure = regexp.MustCompile(`\(about (\d+) lines\)`)
	pathTotal  = regexp.MustCompile(`about (\d+) lines in all`)
)

// readingPath reads the stops of the README's ## Reading path section,
// and the total its opening states for them (0 if it states none).
func readingPath(readme string) ([]stop, int, error) {
	_, section, found := strings.Cut(readme, "\n## Reading path\n")
	if !found {
		return nil, 0, errors.New("the README has no ## Reading path section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var (
		stops []stop
		total int
	)
	for line := range strings.SplitSeq(section, "\n") {
		if !stopItem.MatchString(line) {
			if m := pathTotal.FindStringSubmatch(line); m != nil && stops == nil {
				total, _ = strconv.Atoi(m[1])
			}
			continue
		}
		s := stop{item: line}
		for _, m := range stopRef.FindAllStringSubmatch(line, -1) {
			r := ref{file: m[1], names: []string{m[2]}}
			for _, n := range andName.FindAllStringSubmatch(m[3], -1) {
				r.names = append(r.names, n[1])
			}
			s.refs = append(s.refs, r)
		}
		if s.refs == nil {
			return nil, 0, fmt.Errorf("reading path item names no `file.go:Name` or `file.sql:Name`: %s", line)
		}
		if m := openingOf.FindStringSubmatch(line); m != nil {
			s.opening = m[1]
		}
		if m := stopFigure.FindStringSubmatch(line); m != nil {
			s.figure, _ = strconv.Atoi(m[1])
		}
		stops = append(stops, s)
	}
	return stops, total, nil
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

// stopProblems says what is wrong with the reading path against fsys:
// too many stops or none, a name that is not defined or is too long, a
// stop whose figure is not what it asks a reader to read, an opening whose
// total is not the stops' figures added up.
func stopProblems(fsys fs.FS, stops []stop, total int) []string {
	var wrong []string
	if len(stops) == 0 || len(stops) > maxStops {
		wrong = append(wrong, fmt.Sprintf("the reading path has %d stops; it must have 1 to %d", len(stops), maxStops))
	}
	figures := 0
	for i, s := range stops {
		missing := false
		for _, r := range s.refs {
			for _, name := range r.names {
				def, err := definition(fsys, r.file, name)
				if err != nil {
					wrong = append(wrong, fmt.Sprintf("%v (in %q)", err, s.item))
					missing = true
					continue
				}
				if n := strings.Count(def, "\n") + 1; n > maxStopLines {
					wrong = append(wrong, fmt.Sprintf("%s:%s is %d lines, more than a stop may be (%d)", r.file, name, n, maxStopLines))
				}
			}
		}
		figures += s.figure
		if missing {
			continue
		}
		parts, err := reading(fsys, s)
		if err != nil {
			wrong = append(wrong, fmt.Sprintf("stop %d: %v", i+1, err))
			continue
		}
		if p := figureProblem(s.figure, linesOf(parts)); p != "" {
			wrong = append(wrong, fmt.Sprintf("stop %d (`%s:%s`) %s", i+1, s.refs[0].file, s.refs[0].names[0], p))
		}
	}
	if total != figures {
		wrong = append(wrong, fmt.Sprintf("the reading path's opening says about %d lines in all; its stops' figures add up to %d", total, figures))
	}
	return wrong
}

// figureProblem says what is wrong with a stop's figure, stated, for the n
// lines it asks a reader to read: under them, or over by more than the
// slack; "" if nothing is.
func figureProblem(stated, n int) string {
	fix := fmt.Sprintf("write (about %d lines)", (n+9)/10*10)
	switch {
	case stated == 0:
		return fmt.Sprintf("states no figure; it asks for %d lines to read: %s", n, fix)
	case stated < n:
		return fmt.Sprintf("asks for %d lines to read, more than the README's %d: %s", n, stated, fix)
	case stated-n > max(figureSlack, n/4):
		return fmt.Sprintf("asks for %d lines to read, far fewer than the README's %d: %s", n, stated, fix)
	}
	return ""
}

// TestReadingPath: every stop exists and is short, its figure is what it
// asks a reader to read (the test's log shows what that is made of), and
// the first claim a learner reads teaches SKIP LOCKED and the lease alone:
// the filter that leaves new rows to a change-data-capture stream, and the
// claim's commit setting, are taught where change data capture and the
// store are.
func TestReadingPath(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(path.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	stops, total, err := readingPath(string(readme))
	require.NoError(t, err)
	fsys := os.DirFS(repoRoot)
	// Every package sqlc generates is known by its queries, or what they
	// run would go uncounted.
	c, err := newCodebase(fsys)
	require.NoError(t, err)
	conf, err := fs.ReadFile(fsys, "sqlc.yaml")
	require.NoError(t, err)
	require.Len(t, c.queries, strings.Count(string(conf), "out:"), "sqlc.yaml's packages, as read: %v", c.queries)
	for _, dir := range c.queries {
		require.DirExists(t, path.Join(repoRoot, dir))
	}
	read := 0
	for i, s := range stops {
		parts, err := reading(fsys, s)
		if err != nil {
			continue // stopProblems says why
		}
		read += linesOf(parts)
		var b strings.Builder
		fmt.Fprintf(&b, "stop %d: %d lines to read (the README says about %d):", i+1, linesOf(parts), s.figure)
		for _, p := range parts {
			fmt.Fprintf(&b, "\n\t%4d  %s", p.lines, p.what)
		}
		t.Log(b.String())
	}
	t.Logf("the reading path: %d lines to read (the README says about %d)", read, total)
	wrong := stopProblems(fsys, stops, total)
	require.Empty(t, wrong, "\n"+strings.Join(wrong, "\n"))

	var claim string
	for _, s := range stops {
		for _, r := range s.refs {
			if strings.HasSuffix(r.file, ".sql") && slices.Contains(r.names, "ClaimDue") {
				claim, err = definition(fsys, r.file, "ClaimDue")
				require.NoError(t, err)
			}
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
// name that is not defined, a stop that grew too long, too many stops, a
// figure under or far over what a stop asks for, or missing, a total that
// is not the figures'.
func TestReadingPathCheckCatchesMistakes(t *testing.T) {
	t.Parallel()
	long := "package x\n\nfunc long() {\n" + strings.Repeat("\t_ = 1\n", maxStopLines) + "}\n\nfunc short() {}\n"
	fsys := fstest.MapFS{
		"go.mod":     {Data: []byte("module example.com/m\n")},
		"sqlc.yaml":  {Data: []byte("version: \"2\"\n")},
		"x/x.go":     {Data: []byte(long)},
		"q/q.sql":    {Data: []byte("-- name: Claim :many\nSELECT 1\nFROM t;\n\nCREATE TABLE things (\n    id int\n);\n")},
		"q/semi.sql": {Data: []byte("-- name: Semi :one\n-- A comment; a semicolon.\nSELECT ';' /* ; */\nFROM t;\n")},
		"README.md": {Data: []byte("# x\n\n## Reading path\n\nRead about 103 lines in all.\n\n" +
			"1. `x/x.go:short` and `long` (about 63 lines): two.\n" +
			"2. `q/q.sql:Claim`, then `q/q.sql:things` (about 5 lines): a query and a table.\n" +
			"3. `x/x.go:gone` (about 5 lines): missing.\n" +
			"4. `q/q.sql:things` (about 30 lines): far over.\n" +
			"5. `q/q.sql:things`: no figure.\n\n## Next\n")},
	}
	semi, err := definition(fsys, "q/semi.sql", "Semi")
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(semi, "FROM t;"), "a semicolon in a comment or a string ends no statement: %q", semi)
	readme, err := fs.ReadFile(fsys, "README.md")
	require.NoError(t, err)
	stops, total, err := readingPath(string(readme))
	require.NoError(t, err)
	require.Len(t, stops, 5)
	require.Equal(t, 103, total)
	require.Equal(t, []ref{{"x/x.go", []string{"short", "long"}}}, stops[0].refs)
	require.Equal(t, []ref{{"q/q.sql", []string{"Claim"}}, {"q/q.sql", []string{"things"}}}, stops[1].refs)
	require.Equal(t, []int{63, 5, 5, 30, 0}, []int{stops[0].figure, stops[1].figure, stops[2].figure, stops[3].figure, stops[4].figure})
	wrong := stopProblems(fsys, stops, total)
	require.Len(t, wrong, 5, "%v", wrong)
	require.Contains(t, wrong[0], "x/x.go:long is 62 lines")
	require.Contains(t, wrong[1], "stop 2 (`q/q.sql:Claim`) asks for 6 lines to read, more than the README's 5: write (about 10 lines)")
	require.Contains(t, wrong[2], "x/x.go defines no gone")
	require.Contains(t, wrong[3], "stop 4 (`q/q.sql:things`) asks for 3 lines to read, far fewer than the README's 30: write (about 10 lines)")
	require.Contains(t, wrong[4], "stop 5 (`q/q.sql:things`) states no figure; it asks for 3 lines to read: write (about 10 lines)")

	stops[1].figure, stops[3].figure, stops[4].figure = 6, 18, 3
	require.Equal(t, []string{
		"x/x.go:long is 62 lines, more than a stop may be (60)",
		"x/x.go defines no gone (in \"3. `x/x.go:gone` (about 5 lines): missing.\")",
		"the reading path's opening says about 103 lines in all; its stops' figures add up to 95",
	}, stopProblems(fsys, stops, total))

	var many []stop
	for range maxStops + 1 {
		many = append(many, stops[1])
	}
	require.Contains(t, stopProblems(fsys, many, 66)[0], "11 stops")
	_, _, err = readingPath("# x\n\n## Reading path\n\n1. read the code.\n")
	require.ErrorContains(t, err, "names no")
}
