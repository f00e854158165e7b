package reconcile

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/outbox"
)

// TestCleanSystemHasNoDrift: a system in which every student holds its one
// user reports nothing, whatever else is going on in it: rows on their way
// (pending, and published to the broker), a user an operator made with
// curl, a linked student whose delivered row and answer retention purged,
// a disabled user beside an enabled one with its document number.
func TestCleanSystemHasNoDrift(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var linked []linkedStudent
	for range 5 {
		linked = append(linked, w.linked())
	}
	for _, state := range []string{outbox.StatePending, outbox.StatePublished} {
		id := w.addStudent(w.doc(), ago(time.Minute), uuid.Nil)
		w.addOutbox(id, state, "", ago(time.Minute))
	}
	w.addAnswer("operator", "by-hand-1", w.addUser(w.doc(), ago(time.Hour)), ago(time.Hour))
	old := w.linked()
	w.exec(w.student, `DELETE FROM outbox WHERE student_id = $1`, old.id)
	w.exec(w.users, `DELETE FROM inbox WHERE idempotency_key = $1`, old.key.String())
	disabled := uuid.New()
	w.exec(w.users, `INSERT INTO users (id, name, email, document_number, enabled, created_at)
		VALUES ($1, 'Disabled', 'd@example.com', $2, false, $3)`, disabled, linked[0].doc, ago(2*time.Hour))
	w.addAnswer("operator", "by-hand-2", disabled, ago(2*time.Hour))

	r, code := w.once()
	require.Equal(t, 0, code)
	require.False(t, r.Drift)
	require.Empty(t, counts(r))
	require.Equal(t, KindFull, r.Kind)
	require.Equal(t, 8, r.Judged.Students)
	require.Equal(t, 8, r.Judged.Users)
	require.Len(t, r.Classes, len(drift.Classes), "every class is in the report, with its count")
	// Pages of two: more than one statement on each side, each counted.
	require.Greater(t, r.Read.Student.Statements, 4)
	require.Greater(t, r.Read.Users.Statements, 4)
	require.Positive(t, r.Read.Student.Rows)
	require.Positive(t, r.Read.Users.LongestSeconds)
}

// TestEachClass makes each kind of drift by hand, beside students that are
// right, and sees the reconciler name it: the class, its count, an example
// id, and the exit status (1 for drift; stuck and dead are not drift).
func TestEachClass(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// make breaks the world, and returns the id the report must give
		// as an example.
		make func(w *world, bystander linkedStudent) uuid.UUID
		want map[drift.Class]int
		env  []string
	}{
		{
			name: "a deleted user",
			make: func(w *world, b linkedStudent) uuid.UUID {
				w.exec(w.users, `DELETE FROM users WHERE id = $1`, b.user)
				return b.id
			},
			want: map[drift.Class]int{drift.ClassMissingUser: 1},
		},
		{
			name: "a link to a user id that does not exist",
			make: func(w *world, b linkedStudent) uuid.UUID {
				w.exec(w.student, `UPDATE students SET user_id = $1 WHERE id = $2`, uuid.New(), b.id)
				return b.id
			},
			want: map[drift.Class]int{drift.ClassMissingUser: 1},
		},
		{
			// Users' unique index on enabled users' document numbers makes
			// this impossible; a replica written by something else, or a
			// restore, need not have it. The test drops it to be that
			// replica, and writes the second user as its writer would:
			// with no answer under any key, so it belongs to nobody too.
			name: "a second enabled user with the same document number",
			make: func(w *world, b linkedStudent) uuid.UUID {
				w.exec(w.users, `DROP INDEX users_one_enabled_per_document`)
				return w.addUser(b.doc, ago(30*time.Minute))
			},
			want: map[drift.Class]int{drift.ClassDuplicateDocument: 1, drift.ClassOrphanUser: 1},
		},
		{
			name: "linked to another student's user",
			make: func(w *world, b linkedStudent) uuid.UUID {
				other := w.linked()
				w.exec(w.student, `UPDATE students SET user_id = $1 WHERE id = $2`, other.user, b.id)
				return b.id
			},
			want: map[drift.Class]int{drift.ClassMislinked: 1},
		},
		{
			name: "linked to its own user, whose document number was changed",
			make: func(w *world, b linkedStudent) uuid.UUID {
				w.exec(w.users, `UPDATE users SET document_number = 'SOMEONE-ELSE' WHERE id = $1`, b.user)
				return b.id
			},
			want: map[drift.Class]int{drift.ClassMislinked: 1},
		},
		{
			name: "an orphan user, made under a key no student carries",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				u := w.addUser(w.doc(), ago(time.Hour))
				w.addAnswer(sender, uuid.NewString(), u, ago(time.Hour))
				return u
			},
			want: map[drift.Class]int{drift.ClassOrphanUser: 1},
		},
		{
			name: "a student deleted by hand leaves its user an orphan",
			make: func(w *world, b linkedStudent) uuid.UUID {
				w.exec(w.student, `DELETE FROM outbox WHERE student_id = $1`, b.id)
				w.exec(w.student, `DELETE FROM students WHERE id = $1`, b.id)
				return b.user
			},
			want: map[drift.Class]int{drift.ClassOrphanUser: 1},
		},
		{
			name: "a stuck row",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				id := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
				w.addOutbox(id, outbox.StatePending, outbox.ReasonUsersUnreachable, ago(time.Hour))
				young := w.addStudent(w.doc(), ago(time.Minute), uuid.Nil) // on its way, not stuck
				w.addOutbox(young, outbox.StatePending, "", ago(time.Minute))
				return id
			},
			want: map[drift.Class]int{drift.ClassStuck: 1},
		},
		{
			name: "a row the broker holds, unanswered for long",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				id := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
				w.addOutbox(id, outbox.StatePublished, "", ago(time.Hour))
				return id
			},
			want: map[drift.Class]int{drift.ClassStuck: 1},
		},
		{
			name: "a dead row",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				id := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
				key := w.addOutbox(id, outbox.StateDead, outbox.ReasonRefused, ago(time.Hour))
				w.addAnswer(sender, key.String(), uuid.Nil, ago(time.Hour))
				return id
			},
			want: map[drift.Class]int{drift.ClassDead: 1},
		},
		{
			name: "a row marked delivered without a link",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				id := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
				w.addOutbox(id, outbox.StateDelivered, "", ago(time.Hour))
				return id
			},
			want: map[drift.Class]int{drift.ClassLost: 1},
		},
		{
			name: "a student without an outbox row",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				return w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
			},
			want: map[drift.Class]int{drift.ClassLost: 1},
		},
		{
			name: "a row dead-lettered without a reason",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				id := w.addStudent(w.doc(), ago(time.Hour), uuid.Nil)
				w.addOutbox(id, outbox.StateDead, "", ago(time.Hour))
				return id
			},
			want: map[drift.Class]int{drift.ClassLost: 1},
		},
		{
			// Users made the user, its answer never reached Student, and the
			// sender gave up on the row for its age: the student is lost,
			// and the answer has sat unrecorded past the retry horizon.
			name: "an unrecorded answer",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				doc := w.doc()
				id := w.addStudent(doc, ago(100*time.Hour), uuid.Nil)
				key := w.addOutbox(id, outbox.StateDead, outbox.ReasonExpired, ago(100*time.Hour))
				w.addAnswer(sender, key.String(), w.addUser(doc, ago(99*time.Hour)), ago(99*time.Hour))
				return id
			},
			want: map[drift.Class]int{drift.ClassLost: 1, drift.ClassUnrecordedAnswer: 1},
		},
		{
			name: "an answer unrecorded, within the retry horizon",
			make: func(w *world, _ linkedStudent) uuid.UUID {
				doc := w.doc()
				id := w.addStudent(doc, ago(2*time.Hour), uuid.Nil)
				key := w.addOutbox(id, outbox.StatePending, outbox.ReasonUsersUnreachable, ago(2*time.Hour))
				w.addAnswer(sender, key.String(), w.addUser(doc, ago(2*time.Hour)), ago(2*time.Hour))
				return id
			},
			env:  []string{"RECONCILER_RETRY_HORIZON", "3h"},
			want: map[drift.Class]int{drift.ClassStuck: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			bystanders := w.bystanders()
			example := tt.make(w, bystanders[1])
			r, code := w.once(tt.env...)
			require.Equal(t, tt.want, counts(r))
			drifted := false
			for class := range tt.want {
				require.Contains(t, r.Classes[class].Examples, example.String(), "%s names its case", class)
				require.Positive(t, r.Classes[class].OldestAgeSeconds, class)
				drifted = drifted || class.Invariant()
			}
			require.Equal(t, drifted, r.Drift)
			want := 0
			if drifted {
				want = 1
			}
			require.Equal(t, want, code, "the exit status")
		})
	}
}
