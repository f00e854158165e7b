package docs

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// What a stop of the reading path asks a reader to read is what it names
// and what that leads to in the same package:
//
//   - a Go function or method, from its doc comment to its closing brace,
//     and every function or method of its own package it calls, and so on
//     (each once). Calls are matched by name, with what types the code
//     spells out: f(…) is the package's function f, x.f(…) its method f of
//     x's type if x is declared with one of the package's types, none if
//     with another package's or a built-in one (err error), or else any of
//     its methods f. Other packages' code is not followed: it is other
//     stops, or not the pattern;
//   - the SQL of every sqlc query that code runs, by name, through a
//     package sqlc generated (usersdb.InsertUser, s.q.GetStudent): its
//     statement in db/queries, from its -- name: line to its semicolon;
//   - a SQL statement named by the stop (a query, a CREATE TABLE): itself;
//   - a file's opening comment, which a stop may ask for first.

// part is one thing a stop asks a reader to read, and its length.
type part struct {
	what  string // file:name
	lines int
}

// linesOf adds parts up.
func linesOf(parts []part) int {
	n := 0
	for _, p := range parts {
		n += p.lines
	}
	return n
}

// reading says what s asks a reader to read, in the order of reading.
func reading(fsys fs.FS, s stop) ([]part, error) {
	c, err := newCodebase(fsys)
	if err != nil {
		return nil, err
	}
	var parts []part
	if s.opening != "" {
		p, err := c.opening(s.opening)
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
	}
	r := &reader{c: c, seen: map[string]bool{}}
	for _, ref := range s.refs {
		for _, name := range ref.names {
			if err := r.read(ref.file, name); err != nil {
				return nil, err
			}
		}
	}
	return append(parts, r.parts...), nil
}

// codebase is what the counting needs to know of the repository in fsys.
type codebase struct {
	fsys   fs.FS
	module string // the module's path, from go.mod
	// queries maps the folder of a package sqlc generates to the folder of
	// its queries, from sqlc.yaml.
	queries  map[string]string
	packages map[string]*goPackage // by folder
	sql      map[string]map[string]sqlQuery
}

// sqlQuery is a sqlc query's statement, and where it is.
type sqlQuery struct {
	file, text string
}

func newCodebase(fsys fs.FS) (*codebase, error) {
	c := &codebase{fsys: fsys, queries: map[string]string{}, packages: map[string]*goPackage{}, sql: map[string]map[string]sqlQuery{}}
	mod, err := fs.ReadFile(fsys, "go.mod")
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(mod), "\n") {
		if module, ok := strings.CutPrefix(line, "module "); ok {
			c.module = strings.TrimSpace(module)
			break
		}
	}
	if c.module == "" {
		return nil, errors.New("go.mod names no module")
	}
	conf, err := fs.ReadFile(fsys, "sqlc.yaml")
	if err != nil {
		return nil, err
	}
	c.queries = sqlcFolders(string(conf))
	return c, nil
}

// sqlcFolders reads, from sqlc.yaml, which folder of queries each package
// it generates is made of: in each entry of sql, its queries and its out
// (an entry without out only checks the queries).
func sqlcFolders(conf string) map[string]string {
	folders := map[string]string{}
	var queries, out string
	flush := func() {
		if queries != "" && out != "" {
			folders[path.Clean(out)] = path.Clean(queries)
		}
		queries, out = "", ""
	}
	sc := bufio.NewScanner(strings.NewReader(conf))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "- name:") {
			flush()
		}
		if v, ok := strings.CutPrefix(line, "queries:"); ok {
			queries = strings.Trim(strings.TrimSpace(v), `"'`)
		}
		if v, ok := strings.CutPrefix(line, "out:"); ok {
			out = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	flush()
	return folders
}

// opening is a Go file's opening comment, with its package clause.
func (c *codebase) opening(file string) (part, error) {
	src, err := fs.ReadFile(c.fsys, file)
	if err != nil {
		return part{}, err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		return part{}, err
	}
	if f.Doc == nil {
		return part{}, fmt.Errorf("%s has no opening comment", file)
	}
	return part{what: file + ":package", lines: fset.Position(f.Name.End()).Line - fset.Position(f.Doc.Pos()).Line + 1}, nil
}

// goPackage is a package's functions and methods, by name, the names of
// its types, and the folders of the sqlc queries its files import.
type goPackage struct {
	funcs, methods map[string][]*goFunc
	types          map[string]bool
	queries        []string
}

// goFunc is a function or method, and the file it is in.
type goFunc struct {
	file  string
	decl  *ast.FuncDecl
	recv  string // a method's receiver's type
	lines int
	// imports maps the names its file imports packages by to their paths.
	imports map[string]string
}

// what names f as file:name, a method as file:Type.name.
func (f *goFunc) what() string {
	if f.recv != "" {
		return f.file + ":" + f.recv + "." + f.decl.Name.Name
	}
	return f.file + ":" + f.decl.Name.Name
}

// typeName is the name of the type t spells, without its pointer or type
// arguments: T for *T or T[int]; "" for a type of another package
// (pkg.T) or a type without a name.
func typeName(t ast.Expr) string {
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// declared maps the names f declares to the types they are of, as far as
// the code spells them: in its signature, its function literals' and its
// var statements; and, as another package's type, the names := takes from
// a call of another package's function (b, err := json.Marshal(v)), or
// from a value of its type (x := pkg.T{}).
func declared(f *goFunc) map[string]ast.Expr {
	types := map[string]ast.Expr{}
	fields := func(l *ast.FieldList) {
		if l == nil {
			return
		}
		for _, f := range l.List {
			for _, n := range f.Names {
				types[n.Name] = f.Type
			}
		}
	}
	fields(f.decl.Recv)
	fields(f.decl.Type.Params)
	fields(f.decl.Type.Results)
	ast.Inspect(f.decl.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			fields(n.Type.Params)
			fields(n.Type.Results)
		case *ast.ValueSpec:
			if n.Type != nil {
				for _, name := range n.Names {
					types[name.Name] = n.Type
				}
			}
		case *ast.AssignStmt:
			if n.Tok != token.DEFINE || len(n.Rhs) != 1 {
				return true
			}
			var from ast.Expr
			switch v := n.Rhs[0].(type) {
			case *ast.CallExpr:
				from = v.Fun
			case *ast.CompositeLit:
				from = v.Type
			case *ast.UnaryExpr: // &pkg.T{}
				if c, ok := v.X.(*ast.CompositeLit); ok {
					from = c.Type
				}
			}
			if sel, ok := from.(*ast.SelectorExpr); ok {
				if pkg, ok := sel.X.(*ast.Ident); ok && f.imports[pkg.Name] != "" {
					for _, l := range n.Lhs {
						if id, ok := l.(*ast.Ident); ok {
							types[id.Name] = sel
						}
					}
				}
			}
		}
		return true
	})
	return types
}

// methodsOf narrows the package's methods named like a call on a value to
// those of the value's type, t as declared (nil if not): none if t is not
// one of the package's types; all of them if t is one that declares none
// (an interface, a struct embedding), or is not known.
func (p *goPackage) methodsOf(methods []*goFunc, t ast.Expr) []*goFunc {
	if t == nil {
		return methods
	}
	name := typeName(t)
	if !p.types[name] {
		return nil
	}
	var of []*goFunc
	for _, m := range methods {
		if m.recv == name {
			of = append(of, m)
		}
	}
	if of == nil {
		return methods
	}
	return of
}

// pkg parses the package in folder dir: its Go files but its tests.
func (c *codebase) pkg(dir string) (*goPackage, error) {
	if p, ok := c.packages[dir]; ok {
		return p, nil
	}
	entries, err := fs.ReadDir(c.fsys, dir)
	if err != nil {
		return nil, err
	}
	p := &goPackage{funcs: map[string][]*goFunc{}, methods: map[string][]*goFunc{}, types: map[string]bool{}}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		file := path.Join(dir, name)
		src, err := fs.ReadFile(c.fsys, file)
		if err != nil {
			return nil, err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		imports := map[string]string{}
		for _, spec := range f.Imports {
			imp, _ := strconv.Unquote(spec.Path.Value)
			local := importName(imp)
			if spec.Name != nil {
				local = spec.Name.Name
			}
			imports[local] = imp
			if q, ok := c.queries[strings.TrimPrefix(imp, c.module+"/")]; ok && !slices.Contains(p.queries, q) {
				p.queries = append(p.queries, q)
			}
		}
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, spec := range g.Specs {
					p.types[spec.(*ast.TypeSpec).Name.Name] = true
				}
			}
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			start := fn.Pos()
			if fn.Doc != nil {
				start = fn.Doc.Pos()
			}
			g := &goFunc{file: file, decl: fn, imports: imports,
				lines: fset.Position(fn.End()).Line - fset.Position(start).Line + 1}
			if fn.Recv != nil && len(fn.Recv.List) > 0 {
				g.recv = typeName(fn.Recv.List[0].Type)
			}
			if fn.Recv == nil {
				p.funcs[fn.Name.Name] = append(p.funcs[fn.Name.Name], g)
			} else {
				p.methods[fn.Name.Name] = append(p.methods[fn.Name.Name], g)
			}
		}
	}
	c.packages[dir] = p
	return p, nil
}

// importName is the name a package is imported by when its import names
// none: its path's last element, but for a major version (/v5), and
// without a go- prefix or a .v3 suffix.
func importName(p string) string {
	elems := strings.Split(p, "/")
	name := elems[len(elems)-1]
	if len(elems) > 1 && majorVersion.MatchString(name) {
		name = elems[len(elems)-2]
	}
	name, _, _ = strings.Cut(name, ".")
	name = strings.TrimPrefix(name, "go-")
	return strings.ReplaceAll(name, "-", "")
}

var majorVersion = regexp.MustCompile(`^v\d+$`)

// query is the sqlc query name in the folder of queries dir, if any.
func (c *codebase) query(dir, name string) (sqlQuery, bool, error) {
	qs, ok := c.sql[dir]
	if !ok {
		qs = map[string]sqlQuery{}
		err := fs.WalkDir(c.fsys, dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".sql") {
				return err
			}
			src, err := fs.ReadFile(c.fsys, p)
			if err != nil {
				return err
			}
			for _, m := range queryName.FindAllStringSubmatch(string(src), -1) {
				text, err := definition(c.fsys, p, m[1])
				if err != nil {
					return err
				}
				qs[m[1]] = sqlQuery{file: p, text: text}
			}
			return nil
		})
		if err != nil {
			return sqlQuery{}, false, err
		}
		c.sql[dir] = qs
	}
	q, ok := qs[name]
	return q, ok, nil
}

// queryName finds the names of a file's sqlc queries.
var queryName = regexp.MustCompile(`(?m)^-- name: ([A-Za-z_][A-Za-z0-9_]*) `)

// reader follows one stop's reading, each thing once.
type reader struct {
	c     *codebase
	seen  map[string]bool
	parts []part
}

func (r *reader) add(p part) bool {
	if r.seen[p.what] {
		return false
	}
	r.seen[p.what] = true
	r.parts = append(r.parts, p)
	return true
}

// read adds the statement or function name in file, and what it leads to.
func (r *reader) read(file, name string) error {
	if path.Ext(file) == ".sql" {
		def, err := definition(r.c.fsys, file, name)
		if err != nil {
			return err
		}
		r.add(part{what: file + ":" + name, lines: strings.Count(def, "\n") + 1})
		return nil
	}
	p, err := r.c.pkg(path.Dir(file))
	if err != nil {
		return err
	}
	for _, f := range slices.Concat(p.funcs[name], p.methods[name]) {
		if f.file == file {
			return r.follow(p, f)
		}
	}
	return fmt.Errorf("%s defines no %s", file, name)
}

// follow adds f, and what it calls in its package and the queries it runs.
func (r *reader) follow(p *goPackage, f *goFunc) error {
	if !r.add(part{what: f.what(), lines: f.lines}) || f.decl.Body == nil {
		return nil
	}
	var (
		calls   []*goFunc
		queries []sqlQuery
		err     error
		types   = declared(f)
	)
	query := func(dir, name string) {
		q, ok, qerr := r.c.query(dir, name)
		if qerr != nil {
			err = qerr
		}
		if ok {
			queries = append(queries, q)
		}
	}
	ast.Inspect(f.decl.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			// A query of a generated package by name: usersdb.InsertUser.
			if x, ok := n.X.(*ast.Ident); ok {
				if imp, ok := f.imports[x.Name]; ok {
					if dir, ok := r.c.queries[strings.TrimPrefix(imp, r.c.module+"/")]; ok {
						query(dir, n.Sel.Name)
					}
				}
			}
		case *ast.CallExpr:
			fun := n.Fun
			switch x := fun.(type) { // a generic function, instantiated
			case *ast.IndexExpr:
				fun = x.X
			case *ast.IndexListExpr:
				fun = x.X
			}
			switch x := fun.(type) {
			case *ast.Ident:
				calls = append(calls, p.funcs[x.Name]...)
			case *ast.SelectorExpr:
				methods := p.methods[x.Sel.Name]
				if id, ok := x.X.(*ast.Ident); ok {
					if _, ok := f.imports[id.Name]; ok {
						return true // another package's: a query at most, above
					}
					methods = p.methodsOf(methods, types[id.Name])
				}
				// A method, of the package's or of a generated package's
				// Queries: s.q.GetStudent.
				calls = append(calls, methods...)
				for _, dir := range p.queries {
					query(dir, x.Sel.Name)
				}
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	for _, q := range queries {
		name, _, _ := strings.Cut(strings.TrimPrefix(q.text, "-- name: "), " ")
		r.add(part{what: q.file + ":" + name, lines: strings.Count(q.text, "\n") + 1})
	}
	for _, g := range calls {
		if err := r.follow(p, g); err != nil {
			return err
		}
	}
	return nil
}

// TestReadingCount proves what the counting counts: a helper the code
// calls in its package, once however often and however it recurs, and the
// queries it runs through a generated package, by its name or its method,
// once; not another package's code, nor a method of another package's
// value (err.Error()) or of another type, nor a function it does not call.
func TestReadingCount(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"go.mod": {Data: []byte("module example.com/m\n\ngo 1.26\n")},
		"sqlc.yaml": {Data: []byte("version: \"2\"\nsql:\n  - name: a\n    queries: db/queries/a\n    gen:\n      go:\n        package: adb\n        out: a/adb\n" +
			"  - name: a-elsewhere\n    queries: db/queries/a\n")},
		"db/queries/a/a.sql": {Data: []byte("-- name: GetThing :one\n-- A comment; with a semicolon.\nSELECT 1\nFROM things;\n\n" +
			"-- name: PutThing :exec\nINSERT INTO things VALUES (1);\n\n-- name: Unused :exec\nDELETE FROM things;\n")},
		"a/adb/db.go": {Data: []byte("package adb\n\nfunc GetThing() int { return 1 }\n")},
		"a/a.go": {Data: []byte(`package a

import (
	"strconv"
	"strings"

	"example.com/m/a/adb"
	"example.com/m/b"
)

// Top reads.
func Top(s *S) int {
	n := helper(2)
	n += b.Other()
	n += strings.Count("x", "y")
	return n + s.get()
}

func helper(n int) int {
	if n == 0 {
		return 0
	}
	return helper(n-1) + ping()
}

func ping() int { return pong() }

func pong() int {
	return ping()
}

func unused() {}

type S struct{ q *adb.Queries }

func (s *S) get() int {
	s.q.PutThing()
	_ = adb.GetThing
	if _, err := strconv.Atoi("1"); err != nil {
		_ = err.Error()
	}
	return s.q.GetThing()
}

type T struct{}

func (T) get() int { return 0 }

type E struct{}

func (E) Error() string { return "" }
`)},
		"a/a_test.go": {Data: []byte("package a\n\nfunc helper2() { helper(1) }\n")},
		"b/b.go":      {Data: []byte("package b\n\nfunc Other() int {\n\treturn 1\n}\n\nfunc helper() {}\n")},
	}
	parts, err := reading(fsys, stop{refs: []ref{{file: "a/a.go", names: []string{"Top"}}}})
	require.NoError(t, err)
	require.Equal(t, []part{
		{"a/a.go:Top", 7},
		{"a/a.go:helper", 6},
		{"a/a.go:ping", 1},
		{"a/a.go:pong", 3},
		{"a/a.go:S.get", 8},
		{"db/queries/a/a.sql:PutThing", 2},
		{"db/queries/a/a.sql:GetThing", 4},
	}, parts)
	require.Equal(t, 31, linesOf(parts))

	// A stop that names a query, a table and a function reads each once,
	// and an opening comment first.
	fsys["db/queries/a/a.sql"].Data = append(fsys["db/queries/a/a.sql"].Data, "\nCREATE TABLE things (\n    id int\n);\n"...)
	fsys["a/doc.go"] = &fstest.MapFile{Data: []byte("// Package a is\n// two lines.\npackage a\n")}
	parts, err = reading(fsys, stop{opening: "a/doc.go", refs: []ref{
		{file: "a/a.go", names: []string{"pong"}},
		{file: "db/queries/a/a.sql", names: []string{"GetThing", "things"}},
		{file: "a/a.go", names: []string{"ping"}},
	}})
	require.NoError(t, err)
	require.Equal(t, []part{
		{"a/doc.go:package", 3},
		{"a/a.go:pong", 3},
		{"a/a.go:ping", 1},
		{"db/queries/a/a.sql:GetThing", 4},
		{"db/queries/a/a.sql:things", 3},
	}, parts)

	_, err = reading(fsys, stop{refs: []ref{{file: "a/a.go", names: []string{"gone"}}}})
	require.ErrorContains(t, err, "a/a.go defines no gone")
}
