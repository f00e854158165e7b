package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/outbox"
)

// TestIncrementalPassSeesChangesAfterTheFullPass: after a full pass, an
// incremental one judges only what changed since (not the students the full
// pass judged), finds the drift made meanwhile, keeps what the full pass
// found, and drops a case once what it was about is judged right again.
func TestIncrementalPassSeesChangesAfterTheFullPass(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newWorld(t)
	for range 4 {
		w.linked()
	}
	old := w.addStudent(w.doc(), ago(2*time.Hour), uuid.Nil) // lost before the full pass
	cfg, _, err := LoadConfig(w.env())
	require.NoError(t, err)
	student, users, err := openPools(ctx, cfg)
	require.NoError(t, err)
	defer student.Close()
	defer users.Close()
	c := newChecker(cfg, student, users)

	full, err := c.full(ctx)
	require.NoError(t, err)
	known := full.found
	require.Equal(t, map[drift.Class]int{drift.ClassLost: 1}, counts(full.report(known, time.Now())))

	// Meanwhile: a student whose row is marked delivered without a link, a
	// user made under a key no student carries, a second enabled user of a
	// document (Users' index dropped, as on a replica written by something
	// else, made by the same careless writer under its own caller), and a
	// dead row.
	w.exec(w.users, `DROP INDEX users_one_enabled_per_document`)
	lost := w.addStudent(w.doc(), time.Now(), uuid.Nil)
	w.addOutbox(lost, outbox.StateDelivered, "", time.Now())
	orphan := w.addUser(w.doc(), time.Now())
	w.addAnswer(sender, uuid.NewString(), orphan, time.Now())
	twin := w.linked()
	second := w.addUser(twin.doc, time.Now())
	w.addAnswer("replica-writer", "k-1", second, time.Now())
	dead := w.addStudent(w.doc(), ago(3*time.Hour), uuid.Nil)
	w.addOutbox(dead, outbox.StateDead, outbox.ReasonInvalid, ago(3*time.Hour))

	inc, err := c.incremental(ctx, full.clocks)
	require.NoError(t, err)
	known = known.merge(inc)
	r := inc.report(known, time.Now())
	require.Equal(t, KindIncremental, r.Kind)
	require.Equal(t, map[drift.Class]int{
		drift.ClassLost: 2, drift.ClassOrphanUser: 1, drift.ClassDuplicateDocument: 1, drift.ClassDead: 1,
	}, counts(r))
	require.Contains(t, r.Classes[drift.ClassLost].Examples, lost.String())
	require.Contains(t, r.Classes[drift.ClassLost].Examples, old.String(), "what the full pass found stays")
	require.Contains(t, r.Classes[drift.ClassOrphanUser].Examples, orphan.String())
	require.ElementsMatch(t, []string{twin.user.String(), second.String()}, r.Classes[drift.ClassDuplicateDocument].Examples)
	require.Equal(t, 2, r.Judged.Students, "the new student and the dead row: those the full pass judged, unchanged, are not read again")

	// The new student is repaired by hand; the next incremental pass judges
	// it again and drops its case.
	user := w.addUser(w.doc(), time.Now())
	w.exec(w.student, `UPDATE students SET user_id = $1 WHERE id = $2`, user, lost)
	w.exec(w.users, `UPDATE users SET document_number = $1 WHERE id = $2`, studentDoc(t, w, lost), user)
	var key uuid.UUID
	require.NoError(t, w.student.QueryRow(ctx, `SELECT idempotency_key FROM outbox WHERE student_id = $1`, lost).Scan(&key))
	w.addAnswer(sender, key.String(), user, time.Now())
	inc2, err := c.incremental(ctx, inc.clocks)
	require.NoError(t, err)
	known = known.merge(inc2)
	r = inc2.report(known, time.Now())
	require.Equal(t, 1, r.Classes[drift.ClassLost].Count)
	require.NotContains(t, r.Classes[drift.ClassLost].Examples, lost.String())
}

func studentDoc(t *testing.T, w *world, id uuid.UUID) string {
	t.Helper()
	var doc string
	require.NoError(t, w.student.QueryRow(context.Background(), `SELECT document_number FROM students WHERE id = $1`, id).Scan(&doc))
	return doc
}

// TestSuspectsAreReadAgain: a dead row whose key made a user looks lost,
// until it turns out to have been redriven and delivered between the
// reconciler's read of Student and its read of Users. Every case of the
// invariant's classes is read again before it is reported; one that is
// right by then is not reported.
func TestSuspectsAreReadAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newWorld(t)
	w.linked()
	doc := w.doc()
	id := w.addStudent(doc, ago(time.Hour), uuid.Nil)
	key := w.addOutbox(id, outbox.StateDead, outbox.ReasonExpired, ago(time.Hour))
	user := w.addUser(doc, time.Now())
	w.addAnswer(sender, key.String(), user, time.Now())

	cfg, _, err := LoadConfig(w.env())
	require.NoError(t, err)
	student, users, err := openPools(ctx, cfg)
	require.NoError(t, err)
	defer student.Close()
	defer users.Close()
	c := newChecker(cfg, student, users)
	c.beforeRecheck = func() {
		// The redrive's delivery lands now.
		w.exec(w.student, `UPDATE outbox SET state = 'delivered', delivered_at = now(), dead_at = NULL, reason_class = NULL WHERE student_id = $1`, id)
		w.exec(w.student, `UPDATE students SET user_id = $1 WHERE id = $2`, user, id)
	}
	p, err := c.full(ctx)
	require.NoError(t, err)
	require.True(t, p.suspectStudents[id], "the first reading suspected it")
	require.Empty(t, counts(p.report(p.found, time.Now())), "read again, it is linked")

	// Without the delivery, the case stands.
	w2 := newWorld(t)
	doc = w2.doc()
	id = w2.addStudent(doc, ago(time.Hour), uuid.Nil)
	key = w2.addOutbox(id, outbox.StateDead, outbox.ReasonExpired, ago(time.Hour))
	w2.addAnswer(sender, key.String(), w2.addUser(doc, ago(time.Hour)), ago(time.Hour))
	r, code := w2.once()
	require.Equal(t, 1, code)
	require.Equal(t, map[drift.Class]int{drift.ClassLost: 1}, counts(r))
}
