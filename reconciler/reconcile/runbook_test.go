package reconcile

import (
	"context"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/outbox"
)

// runbookPage is the runbook, from this package's folder.
const runbookPage = "../../docs/runbook.md"

// repair is one of the runbook's repair scripts.
type repair struct {
	name  string
	users bool // run on Users' database, not Student's
	sql   string
}

var (
	sqlBlock = regexp.MustCompile("(?s)```sql\n(.*?)```")
	// The first line of a script names it and its database.
	scriptHeader = regexp.MustCompile(`^-- ([a-z-]+): on (Student's|Users') database\.`)
	psqlVar      = regexp.MustCompile(`:'([a-z_]+)'`)
)

// runbookRepairs reads the repair scripts of the runbook's drift section.
func runbookRepairs(t *testing.T) map[string]repair {
	t.Helper()
	page, err := os.ReadFile(runbookPage)
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(page), "\n## Drift: the reconciler's classes\n")
	require.True(t, ok, "%s has no drift section", runbookPage)
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]repair{}
	for _, m := range sqlBlock.FindAllStringSubmatch(section, -1) {
		// Blocks inside a list item are indented; psql does not mind, and
		// neither does the test.
		var lines []string
		for l := range strings.SplitSeq(m[1], "\n") {
			lines = append(lines, strings.TrimPrefix(l, "  "))
		}
		script := strings.Join(lines, "\n")
		h := scriptHeader.FindStringSubmatch(script)
		require.NotNil(t, h, "a repair script's first line names it and its database: %q", script)
		out[h[1]] = repair{name: h[1], users: h[2] == "Users'", sql: script}
	}
	return out
}

// run runs the script as psql would with -v name=value for each of vars
// (:'name' is the value, quoted), as the database's administrator.
func (r repair) run(t *testing.T, w *world, vars map[string]uuid.UUID) {
	t.Helper()
	sql := psqlVar.ReplaceAllStringFunc(r.sql, func(v string) string {
		id, ok := vars[psqlVar.FindStringSubmatch(v)[1]]
		require.True(t, ok, "%s uses %s, which the test does not give", r.name, v)
		return "'" + id.String() + "'"
	})
	pool := w.student
	if r.users {
		pool = w.users
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// No arguments: pgx sends the script as one simple query, as psql
	// does a file, statements and transaction control included.
	_, err := pool.Exec(ctx, sql)
	require.NoError(t, err, "%s:\n%s", r.name, sql)
}

// TestRunbookRepairsClearDrift makes each drift class by hand, as
// classes_test.go does, runs the runbook's repair for it exactly as the
// runbook prints it, and sees the reconciler find no drift afterwards:
// the repairs an operator runs at night are the ones that were tested.
func TestRunbookRepairsClearDrift(t *testing.T) {
	t.Parallel()
	repairs := runbookRepairs(t)
	type step struct {
		script string
		vars   map[string]uuid.UUID
	}
	tests := []struct {
		name string
		// make breaks the world and returns the repairs that mend it.
		make func(w *world, b linkedStudent) []step
		// broken is what the reconciler finds before the repair.
		broken map[drift.Class]int
	}{
		{
			name: "lost: dead although Users made its user",
			make: func(w *world, _ linkedStudent) []step {
				doc := w.doc()
				id := w.addStudent(doc, ago(2*time.Hour), uuid.Nil)
				key := w.addOutbox(id, outbox.StateDead, outbox.ReasonExpired, ago(2*time.Hour))
				user := w.addUser(doc, ago(2*time.Hour))
				w.addAnswer(sender, key.String(), user, ago(2*time.Hour))
				return []step{{"record-link", map[string]uuid.UUID{"student_id": id, "user_id": user}}}
			},
			broken: map[drift.Class]int{drift.ClassLost: 1},
		},
		{
			name: "lost: delivered without a link, Users having stored nothing",
			make: func(w *world, _ linkedStudent) []step {
				id := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
				w.addOutbox(id, outbox.StateDelivered, "", ago(time.Hour))
				return []step{{"deliver-again", map[string]uuid.UUID{"student_id": id}}}
			},
			broken: map[drift.Class]int{drift.ClassLost: 1},
		},
		{
			name: "lost: no outbox row",
			make: func(w *world, _ linkedStudent) []step {
				id := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
				return []step{{"new-operation", map[string]uuid.UUID{"student_id": id}}}
			},
			broken: map[drift.Class]int{drift.ClassLost: 1},
		},
		{
			name: "missing-user: the user deleted by hand",
			make: func(w *world, b linkedStudent) []step {
				w.exec(w.users, `DELETE FROM users WHERE id = $1`, b.user)
				return []step{{"new-operation", map[string]uuid.UUID{"student_id": b.id}}}
			},
			broken: map[drift.Class]int{drift.ClassMissingUser: 1},
		},
		{
			name: "mislinked: linked to another student's user",
			make: func(w *world, b linkedStudent) []step {
				other := w.linked()
				w.exec(w.student, `UPDATE students SET user_id = $1 WHERE id = $2`, other.user, b.id)
				return []step{{"relink", map[string]uuid.UUID{"student_id": b.id, "user_id": b.user}}}
			},
			broken: map[drift.Class]int{drift.ClassMislinked: 1},
		},
		{
			name: "orphan-user: made under a key no student carries",
			make: func(w *world, _ linkedStudent) []step {
				u := w.addUser(w.doc(), ago(time.Hour))
				w.addAnswer(sender, uuid.NewString(), u, ago(time.Hour))
				return []step{{"disable-user", map[string]uuid.UUID{"user_id": u}}}
			},
			broken: map[drift.Class]int{drift.ClassOrphanUser: 1},
		},
		{
			name: "duplicate-document: a second enabled user, the index gone",
			make: func(w *world, b linkedStudent) []step {
				w.exec(w.users, `DROP INDEX users_one_enabled_per_document`)
				second := w.addUser(b.doc, ago(30*time.Minute))
				return []step{
					{"disable-user", map[string]uuid.UUID{"user_id": second}},
					{"restore-index", nil},
				}
			},
			broken: map[drift.Class]int{drift.ClassDuplicateDocument: 1, drift.ClassOrphanUser: 1},
		},
		{
			name: "unrecorded-answer: the sender gave up, Users remembers",
			make: func(w *world, _ linkedStudent) []step {
				doc := w.doc()
				id := w.addStudent(doc, ago(100*time.Hour), uuid.Nil)
				key := w.addOutbox(id, outbox.StateDead, outbox.ReasonExpired, ago(100*time.Hour))
				user := w.addUser(doc, ago(99*time.Hour))
				w.addAnswer(sender, key.String(), user, ago(99*time.Hour))
				return []step{{"record-link", map[string]uuid.UUID{"student_id": id, "user_id": user}}}
			},
			broken: map[drift.Class]int{drift.ClassLost: 1, drift.ClassUnrecordedAnswer: 1},
		},
	}
	// Every script the runbook prints is run by some case: checked once
	// the parallel cases have all ended.
	var mu sync.Mutex
	ran := map[string]bool{}
	t.Cleanup(func() {
		for name := range repairs {
			require.True(t, ran[name], "the runbook's %s script is run by no case here", name)
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			bystanders := w.bystanders()
			steps := tt.make(w, bystanders[1])
			r, code := w.once()
			require.Equal(t, tt.broken, counts(r), "before the repair")
			require.Equal(t, 1, code)
			for _, s := range steps {
				script, ok := repairs[s.script]
				require.True(t, ok, "the runbook has no %s script (it has %v)", s.script, repairs)
				script.run(t, w, s.vars)
				mu.Lock()
				ran[s.script] = true
				mu.Unlock()
			}
			r, code = w.once()
			require.False(t, r.Drift, "after the repair: %v", counts(r))
			require.Equal(t, 0, code)
			for class := range counts(r) {
				require.False(t, class.Invariant(), "after the repair, %s: %v", class, counts(r))
			}
		})
	}
}
