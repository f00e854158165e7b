package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The bound runs the services' own SQL. testkit may not import
// services/*/internal or outbox-sender/internal (Go's internal rule), where
// sqlc's generated code lives, so it reads the statements from the files sqlc
// generates that code from: db/queries/*/*.sql, in blocks that each start
// with "-- name: Foo :kind". A statement that is renamed or removed there
// fails the loader's test and the bench's start, rather than leaving the
// bound measuring SQL the services no longer run.

// neededQueries are the statements the bound runs, each with the parameters
// it binds, in the order sqlc numbers them. The inbox's own statements are
// run by internal/inbox itself (intakeBound, burndownBound), not loaded
// here.
var neededQueries = map[string][]string{
	"InsertStudentWithOutbox": {"id", "name", "email", "document_number", "created_at", "idempotency_key", "operation", "payload", "trace_parent"},
	"InsertUser":              {"id", "name", "email", "document_number"},
	"ClaimDue":                {"lease", "claimed_by", "batch_size", "max_age"},
	"LinkStudents":            {"outbox_ids", "student_ids", "user_ids", "conflict_errors"},
	"RecordEvents":            {"outbox_ids", "keep", "kind", "actor", "attempts", "outcomes", "reason_classes", "errors", "idempotency_keys"},
}

// query is one statement with its parameters replaced by $1, $2, … as sqlc
// numbers them: in order of first appearance, a repeated name reusing its
// number.
type query struct {
	name   string
	sql    string
	params []string
}

// args returns the positional arguments for q from named ones. Every
// parameter must be given and nothing else: a statement whose parameters
// changed must fail here, not run with the wrong values.
func (q query) args(named map[string]any) ([]any, error) {
	if len(named) != len(q.params) {
		return nil, fmt.Errorf("query %s: got %d arguments, it takes %v", q.name, len(named), q.params)
	}
	out := make([]any, len(q.params))
	for i, p := range q.params {
		v, ok := named[p]
		if !ok {
			return nil, fmt.Errorf("query %s: no argument for parameter %s (it takes %v)", q.name, p, q.params)
		}
		out[i] = v
	}
	return out, nil
}

type queries map[string]query

// loadQueries reads every db/queries/*/*.sql under root (the repository's root)
// and checks that each of neededQueries is there with its parameters.
func loadQueries(root string) (queries, error) {
	files, err := filepath.Glob(filepath.Join(root, "db", "queries", "*", "*.sql"))
	if err != nil {
		return nil, fmt.Errorf("load queries: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("load queries: no db/queries/*/*.sql under %s", root)
	}
	qs := queries{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("load queries: %w", err)
		}
		parsed, err := parseQueries(string(b))
		if err != nil {
			return nil, fmt.Errorf("load queries: %s: %w", f, err)
		}
		for _, q := range parsed {
			if _, dup := qs[q.name]; dup {
				return nil, fmt.Errorf("load queries: %s: %s defined twice", f, q.name)
			}
			qs[q.name] = q
		}
	}
	var errs []error
	for name, params := range neededQueries {
		q, ok := qs[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("query %s is gone from db/queries: the bench's bound runs it", name))
		case strings.Join(q.params, ",") != strings.Join(params, ","):
			errs = append(errs, fmt.Errorf("query %s takes %v now, the bench binds %v", name, q.params, params))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("load queries: %w", err)
	}
	return qs, nil
}

var nameLine = regexp.MustCompile(`^--\s*name:\s*(\w+)\s+:(one|many|exec|execrows|execresult|copyfrom|batchexec|batchmany|batchone)\s*$`)

// parseQueries splits one query file into its named statements.
func parseQueries(text string) ([]query, error) {
	var (
		out  []query
		name string
		body []string
	)
	flush := func() error {
		if name == "" {
			return nil
		}
		sql, params, err := numberParams(strings.Join(body, "\n"))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		sql = strings.TrimSuffix(strings.TrimSpace(sql), ";")
		if sql == "" {
			return fmt.Errorf("%s: no statement", name)
		}
		out = append(out, query{name: name, sql: sql, params: params})
		return nil
	}
	for line := range strings.SplitSeq(text, "\n") {
		if m := nameLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			if err := flush(); err != nil {
				return nil, err
			}
			name, body = m[1], nil
			continue
		}
		// Whole-line comments go: sqlc drops them too, and they may
		// mention a parameter ("the newest @keep events") that must not
		// be numbered.
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		if name != "" {
			body = append(body, line)
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

var paramRef = regexp.MustCompile(`^(?:@([A-Za-z_]\w*)|sqlc\.n?arg\(\s*'?([A-Za-z_]\w*)'?\s*\))`)

// numberParams replaces @name, sqlc.arg(name) and sqlc.narg(name) with $n,
// numbered in order of first appearance, outside string literals and quoted
// identifiers.
func numberParams(sql string) (string, []string, error) {
	var (
		b      strings.Builder
		params []string
		index  = map[string]int{}
		quote  byte // ' or " while inside a literal or quoted identifier
	)
	for i := 0; i < len(sql); {
		c := sql[i]
		if quote != 0 {
			b.WriteByte(c)
			if c == quote {
				quote = 0
			}
			i++
			continue
		}
		if c == '\'' || c == '"' {
			quote = c
			b.WriteByte(c)
			i++
			continue
		}
		if c == '@' || c == 's' {
			if m := paramRef.FindStringSubmatch(sql[i:]); m != nil && (c == '@' || i == 0 || !isWordByte(sql[i-1])) {
				p := m[1] + m[2]
				n, ok := index[p]
				if !ok {
					params = append(params, p)
					n = len(params)
					index[p] = n
				}
				fmt.Fprintf(&b, "$%d", n)
				i += len(m[0])
				continue
			}
		}
		b.WriteByte(c)
		i++
	}
	if quote != 0 {
		return "", nil, errors.New("unterminated quote")
	}
	return b.String(), params, nil
}

func isWordByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// repoRoot finds the repository's root, the directory holding go.work,
// from the working directory up: `make bench` runs from the root, `go test`
// from this package. (Not the nearest go.mod: testkit/ is a module of its
// own, and db/queries and the binaries are in the root one.)
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root: no go.work above the working directory")
		}
		dir = parent
	}
}
