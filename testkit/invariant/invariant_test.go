package invariant

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// world builds a State one student at a time, the way the system would
// leave it, so each test case reads as a story.
type world struct {
	st State
	n  int
}

// student adds a student with its outbox row and returns its id and key.
func (w *world) student(state string, attempts int) (uuid.UUID, string) {
	w.n++
	id, key := uuid.New(), uuid.NewString()
	w.st.Students = append(w.st.Students, StudentRow{ID: id, DocumentNumber: docOf(w.n)})
	w.st.Outbox = append(w.st.Outbox, OutboxRow{StudentID: id, Key: key, State: state, Attempts: attempts, ClaimedBy: "sender-1"})
	return id, key
}

// user adds a user with the document of the n-th student.
func (w *world) user(doc string) uuid.UUID {
	id := uuid.New()
	w.st.Users = append(w.st.Users, UserRow{ID: id, DocumentNumber: doc, Enabled: true})
	return id
}

func (w *world) inbox(key string, user uuid.UUID, replays int) {
	row := InboxRow{Key: key, StatusCode: 201, Replays: replays}
	if user != uuid.Nil {
		row.ResourceID = uuid.NullUUID{UUID: user, Valid: true}
	} else {
		row.StatusCode = 409
	}
	w.st.Inbox = append(w.st.Inbox, row)
}

func (w *world) link(student, user uuid.UUID) {
	for i := range w.st.Students {
		if w.st.Students[i].ID == student {
			w.st.Students[i].UserID = uuid.NullUUID{UUID: user, Valid: true}
		}
	}
}

func (w *world) setError(student uuid.UUID, why string) {
	for i := range w.st.Outbox {
		if w.st.Outbox[i].StudentID == student {
			w.st.Outbox[i].LastError = why
		}
	}
}

func docOf(n int) string { return "DOC-" + string(rune('A'+n)) }

// linkedStudent is the happy path: delivered, linked, stored in the inbox.
func (w *world) linkedStudent(attempts, replays int) uuid.UUID {
	id, key := w.student("delivered", attempts)
	u := w.user(docOf(w.n))
	w.inbox(key, u, replays)
	w.link(id, u)
	return id
}

func TestClassifyHappyPath(t *testing.T) {
	var w world
	a := w.linkedStudent(1, 0)
	b := w.linkedStudent(3, 2) // two lost answers, then a replay that landed
	r := Classify(w.st, Input{Acked: []uuid.UUID{a, b}})

	require.Equal(t, 2, r.Students)
	require.Equal(t, 2, r.Linked)
	require.Equal(t, 2, r.Users)
	require.Equal(t, 2, r.Redeliveries, "attempts beyond the first")
	require.Equal(t, 2, r.Replays)
	require.Equal(t, map[string]int{"sender-1": 2}, r.ClaimedBy)
	require.Empty(t, Violations(r, Expect{}))
	require.Empty(t, r.Problems)
}

func TestClassifyEachFailure(t *testing.T) {
	tests := []struct {
		name  string
		build func(w *world) uuid.UUID // returns the student under test
		class Class
		// unexpected users the case leaves behind
		unexpected int
	}{
		{
			name: "delivered before Users answered and the answer was lost",
			build: func(w *world) uuid.UUID {
				id, key := w.student("delivered", 1)
				w.inbox(key, w.user(docOf(w.n)), 0)
				return id
			},
			class: Lost,
		},
		{
			name: "delivered but Users never got it",
			build: func(w *world) uuid.UUID {
				id, _ := w.student("delivered", 1)
				return id
			},
			class: Lost,
		},
		{
			name: "a student without an outbox row",
			build: func(w *world) uuid.UUID {
				id, _ := w.student("delivered", 1)
				w.st.Outbox = w.st.Outbox[:len(w.st.Outbox)-1]
				return id
			},
			class: Lost,
		},
		{
			name: "Users ignored the key: first answer lost, the retry was refused by the business rule",
			build: func(w *world) uuid.UUID {
				id, key := w.student("dead", 2)
				w.user(docOf(w.n)) // created by the first request, recorded nowhere
				w.inbox(key, uuid.Nil, 0)
				w.setError(id, "Users answered 409 Document number already in use")
				return id
			},
			class:      Dead,
			unexpected: 1,
		},
		{
			name: "dead-lettered without a reason",
			build: func(w *world) uuid.UUID {
				id, _ := w.student("dead", 1)
				return id
			},
			class: Lost,
		},
		{
			name: "dead-lettered although Users created the user",
			build: func(w *world) uuid.UUID {
				id, key := w.student("dead", 1)
				w.inbox(key, w.user(docOf(w.n)), 0)
				w.setError(id, "gave up")
				return id
			},
			class: Lost,
		},
		{
			name: "two users for one document number",
			build: func(w *world) uuid.UUID {
				id, key := w.student("delivered", 2)
				u1 := w.user(docOf(w.n))
				w.user(docOf(w.n))
				w.inbox(key, u1, 0)
				w.link(id, u1)
				return id
			},
			class:      Duplicated,
			unexpected: 1,
		},
		{
			name: "linked to a user other than the stored result",
			build: func(w *world) uuid.UUID {
				id, key := w.student("delivered", 1)
				stored := w.user(docOf(w.n))
				w.inbox(key, stored, 0)
				w.link(id, w.user("DOC-OTHER"))
				return id
			},
			class: Mislinked,
		},
		{
			name: "linked to a user Users does not have",
			build: func(w *world) uuid.UUID {
				id, key := w.student("delivered", 1)
				stored := w.user(docOf(w.n))
				w.inbox(key, stored, 0)
				w.link(id, uuid.New())
				return id
			},
			class: MissingUser,
		},
		{
			name: "linked although Users stored nothing under the key",
			build: func(w *world) uuid.UUID {
				id, _ := w.student("delivered", 1)
				w.link(id, w.user(docOf(w.n)))
				return id
			},
			class: Mislinked,
		},
		{
			name: "linked to a user with another document number",
			build: func(w *world) uuid.UUID {
				id, key := w.student("delivered", 1)
				u := w.user("SOMEONE-ELSE")
				w.inbox(key, u, 0)
				w.link(id, u)
				return id
			},
			class: Mislinked,
		},
		{
			name: "still pending",
			build: func(w *world) uuid.UUID {
				id, _ := w.student("pending", 4)
				return id
			},
			class: Pending,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w world
			w.linkedStudent(1, 0) // a bystander that must stay linked
			id := tt.build(&w)
			r := Classify(w.st, Input{})
			require.Equal(t, tt.class, r.ByClass[id], "problems: %v", r.Problems)
			require.Equal(t, 1, r.Linked, "the bystander")
			require.Equal(t, tt.unexpected, r.Unexpected, "problems: %v", r.Problems)
			if tt.class != Linked {
				require.NotEmpty(t, r.Problems, "a failure must be explained")
			}
			if tt.class != Dead || tt.unexpected > 0 {
				require.NotEmpty(t, Violations(r, Expect{}), "a scenario with this state must fail")
			}
		})
	}
}

func TestClassifyPoisonRowAndForeignUsers(t *testing.T) {
	var w world
	for range 3 {
		w.linkedStudent(1, 0)
	}
	// The test seeded a user under its own key; the poison student has the
	// same document number and its row was dead-lettered with the reason.
	seedKey := "seed-" + uuid.NewString()
	poison, key := w.student("dead", 1)
	seeded := w.user(docOf(w.n))
	w.inbox(seedKey, seeded, 0)
	w.inbox(key, uuid.Nil, 0)
	w.setError(poison, "Users answered 409 Document number already in use")

	without := Classify(w.st, Input{})
	require.Equal(t, 1, without.Unexpected, "a seeded user nobody declared is unexpected")

	r := Classify(w.st, Input{ForeignKeys: []string{seedKey}})
	require.Equal(t, Dead, r.ByClass[poison])
	require.Equal(t, 3, r.Linked)
	require.Equal(t, 1, r.Foreign)
	require.Zero(t, r.Unexpected)
	require.Equal(t, map[string]int{"Users answered 409 Document number already in use": 1}, r.DeadReasons)
	require.Empty(t, Violations(r, Expect{Dead: 1}))
	require.Equal(t, []string{"dead = 1, want 0"}, Violations(r, Expect{}))
}

func TestClassifyVanishedAcknowledgement(t *testing.T) {
	var w world
	a := w.linkedStudent(1, 0)
	ghost := uuid.New()
	r := Classify(w.st, Input{Acked: []uuid.UUID{a, ghost}})
	require.Equal(t, 1, r.Vanished)
	require.Contains(t, Violations(r, Expect{}), "vanished = 1, want 0")
}

func TestReportTable(t *testing.T) {
	var w world
	w.linkedStudent(2, 1)
	table := Classify(w.st, Input{}).Table()
	require.Contains(t, table, "students")
	require.Contains(t, table, "replays")
	require.NotContains(t, table, "first problems")
}

// TestLoad runs the loader against real schemas, so a migration that
// renames a column the checker reads fails here and not in the middle of a
// fault scenario.
func TestLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	studentURL := pgtest.URL(t, migrations.Student)
	usersURL := pgtest.URL(t, migrations.Users)
	studentDB := pgtest.Connect(t, studentURL)
	usersDB := pgtest.Connect(t, usersURL)

	studentID, userID, key := uuid.New(), uuid.New(), uuid.New()
	exec := func(pool *pgxpool.Pool, sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(studentDB, `INSERT INTO students (id, name, email, document_number, user_id) VALUES ($1, 'Ada', 'ada@example.com', 'DOC-1', $2)`, studentID, userID)
	exec(studentDB, `INSERT INTO outbox (idempotency_key, operation, student_id, payload, state, attempts, claimed_by)
		VALUES ($1, 'create-user', $2, '{}', 'delivered', 2, 'sender-1')`, key, studentID)
	exec(usersDB, `INSERT INTO users (id, name, email, document_number) VALUES ($1, 'Ada', 'ada@example.com', 'DOC-1')`, userID)
	exec(usersDB, `INSERT INTO inbox (idempotency_key, request_hash, request, status_code, response_body, resource_id, replays)
		VALUES ($1, '\x00', '{}', 201, '{}', $2, 1)`, key.String(), userID)

	st, err := Load(ctx, studentURL, usersURL)
	require.NoError(t, err)
	require.Equal(t, []StudentRow{{ID: studentID, DocumentNumber: "DOC-1", UserID: uuid.NullUUID{UUID: userID, Valid: true}}}, st.Students)
	require.Equal(t, []OutboxRow{{StudentID: studentID, Key: key.String(), State: "delivered", Attempts: 2, ClaimedBy: "sender-1"}}, st.Outbox)
	require.Equal(t, []UserRow{{ID: userID, DocumentNumber: "DOC-1", Enabled: true}}, st.Users)
	require.Equal(t, []InboxRow{{Key: key.String(), StatusCode: 201, ResourceID: uuid.NullUUID{UUID: userID, Valid: true}, Replays: 1}}, st.Inbox)

	r := Classify(st, Input{Acked: []uuid.UUID{studentID}})
	require.Equal(t, 1, r.Linked)
	require.Equal(t, 1, r.Redeliveries)
	require.Equal(t, 1, r.Replays)
	require.Empty(t, Violations(r, Expect{}))

	// A live read of the same rows through pools: users that were there
	// before Student was read are all judged.
	live, in, err := LoadLive(ctx, studentDB, usersDB)
	require.NoError(t, err)
	require.Equal(t, st, live)
	require.Equal(t, Input{Live: true, Recent: map[uuid.UUID]bool{}}, in)
}

// TestClassifyLiveRecentUsers: a live read may see a user made for a
// student created after Student was read, or for a dead row redriven
// since. Neither may count against the system, and only those users, the
// Recent ones, are spared.
func TestClassifyLiveRecentUsers(t *testing.T) {
	t.Parallel()
	var w world
	stray := w.user("DOC-NEW") // its student is not in the read
	deadID, deadKey := w.student("dead", 1)
	w.setError(deadID, "invalid-request")
	redriven := w.user(docOf(w.n))
	w.inbox(deadKey, redriven, 0)

	r := Classify(w.st, Input{})
	require.Equal(t, 1, r.Unexpected, "without Recent the stray user is unexpected")
	require.Equal(t, Lost, r.ByClass[deadID], "without Recent a dead row with a user is lost")

	r = Classify(w.st, Input{Recent: map[uuid.UUID]bool{stray: true, redriven: true}})
	require.Zero(t, r.Unexpected)
	require.Equal(t, Pending, r.ByClass[deadID])
	require.Zero(t, r.Lost)

	// Pending rows are a problem to describe only once the system is
	// quiet.
	pendingID, _ := w.student("pending", 1)
	r = Classify(w.st, Input{Live: true, Recent: map[uuid.UUID]bool{stray: true, redriven: true}})
	require.Equal(t, Pending, r.ByClass[pendingID])
	require.Empty(t, r.Problems)
	r = Classify(w.st, Input{Recent: map[uuid.UUID]bool{stray: true, redriven: true}})
	require.Len(t, r.Problems, 1)
	require.Contains(t, r.Problems[0], "pending: student "+pendingID.String())

	checks := r.Checks()
	require.Len(t, checks, 4)
	for _, c := range checks {
		require.NotEmpty(t, c.Explanation, c.Name)
	}
}

// TestClassifyCallers: keys are scoped by caller. With Input.Caller set,
// an operator's key equal to a student's does not answer for the student,
// and the operator's users are foreign, not unexpected.
func TestClassifyCallers(t *testing.T) {
	t.Parallel()
	var w world
	id, key := w.student("delivered", 1)
	mine := w.user(docOf(w.n))
	w.inbox(key, mine, 0)
	w.link(id, mine)
	w.st.Inbox[0].Caller = "outbox-sender"
	// An operator reused the student's key for a user of its own.
	theirs := w.user("DOC-OPERATOR")
	w.st.Inbox = append(w.st.Inbox, InboxRow{Caller: "operator", Key: key, StatusCode: 201, ResourceID: uuid.NullUUID{UUID: theirs, Valid: true}})

	r := Classify(w.st, Input{Caller: "outbox-sender"})
	require.Equal(t, Linked, r.ByClass[id])
	require.Equal(t, 1, r.Foreign)
	require.Zero(t, r.Unexpected)
	require.Empty(t, r.Problems)

	// Read as another caller's, the student's link matches nothing.
	r = Classify(w.st, Input{Caller: "operator"})
	require.Equal(t, Mislinked, r.ByClass[id])
}

// TestClassifyRunbookPoisonRow follows the runbook's poison row: an
// operator creates a user with curl (its own caller and key), a student
// with the same document number is refused and dead-lettered, the operator
// disables the other user and redrives the row with a new key, and Users
// creates the student's user. Two users carry the document number; one is
// the operator's, foreign to the pattern, and the student has exactly one.
func TestClassifyRunbookPoisonRow(t *testing.T) {
	t.Parallel()
	const sender, doc = "outbox-sender", "999-9"
	var w world
	operators := w.user(doc)
	w.st.Users[0].Enabled = false // disabled by hand before the redrive
	w.st.Inbox = append(w.st.Inbox, InboxRow{Caller: "operator", Key: "someone-else", StatusCode: 201,
		ResourceID: uuid.NullUUID{UUID: operators, Valid: true}})
	id, firstKey := w.student("delivered", 1)
	w.st.Students[0].DocumentNumber = doc
	w.st.Inbox = append(w.st.Inbox, InboxRow{Caller: sender, Key: firstKey, StatusCode: 409}) // the refusal, stored
	newKey := uuid.NewString()
	w.st.Outbox[0].Key = newKey // new-operation: the row carries the new key
	its := w.user(doc)
	w.st.Inbox = append(w.st.Inbox, InboxRow{Caller: sender, Key: newKey, StatusCode: 201, ResourceID: uuid.NullUUID{UUID: its, Valid: true}})
	w.link(id, its)

	for _, live := range []bool{false, true} {
		r := Classify(w.st, Input{Caller: sender, Live: live})
		require.Equal(t, Linked, r.ByClass[id], "live=%v: %v", live, r.Problems)
		require.Zero(t, r.Duplicated, "the operator's user is not the student's second")
		require.Equal(t, 1, r.Foreign)
		require.Zero(t, r.Unexpected)
		require.Empty(t, Violations(r, Expect{}))
	}
	// The same users made under the sender's own keys are no duplicate,
	// since the operator's is disabled: one enabled user per document is
	// the rule (drift.Duplicated). Nor is the disabled one unexpected:
	// disabling is how an operator takes a user out of use (drift.Orphan).
	w.st.Inbox[0].Caller = sender
	r := Classify(w.st, Input{Caller: sender})
	require.Equal(t, Linked, r.ByClass[id])
	require.Zero(t, r.Unexpected)
	require.Empty(t, Violations(r, Expect{}))
	// Enabled again, it is the second user of the student's document, and
	// a user no student accounts for.
	w.st.Users[0].Enabled = true
	r = Classify(w.st, Input{Caller: sender})
	require.Equal(t, Duplicated, r.ByClass[id])
	require.Equal(t, 1, r.Unexpected)
	require.NotEmpty(t, Violations(r, Expect{}))
}

// TestClassifyPublished: with the broker transport a row waits in state
// published for Users' answer. It is on its way, like a pending row: a live
// read must not call it lost, and a quiet one counts it as pending.
func TestClassifyPublished(t *testing.T) {
	t.Parallel()
	var w world
	id, _ := w.student("published", 1)
	r := Classify(w.st, Input{Live: true})
	require.Equal(t, Pending, r.ByClass[id])
	require.Zero(t, r.Lost)
	require.Empty(t, r.Problems)
	r = Classify(w.st, Input{})
	require.Equal(t, Pending, r.ByClass[id])
	require.Equal(t, []string{"pending = 1, want 0"}, Violations(r, Expect{}))
}

// TestClassifyLivePurged: retention purges delivered outbox rows and old
// inbox rows while the system runs. A live read judges such a linked
// student by its user alone; a quiet read, which follows a test too short
// for retention, still calls it mislinked.
func TestClassifyLivePurged(t *testing.T) {
	t.Parallel()
	var w world
	noOutbox := w.linkedStudent(1, 0)
	w.st.Outbox = w.st.Outbox[:0]
	noInbox := w.linkedStudent(1, 0)
	w.st.Inbox = w.st.Inbox[:0]
	wrongUser, _ := w.student("delivered", 1)
	w.st.Outbox = w.st.Outbox[:1]
	w.link(wrongUser, w.user("DOC-SOMEONE-ELSE"))

	r := Classify(w.st, Input{Live: true})
	require.Equal(t, Linked, r.ByClass[noOutbox])
	require.Equal(t, Linked, r.ByClass[noInbox])
	require.Equal(t, Mislinked, r.ByClass[wrongUser], "a link to a user with another document is wrong, purged or not")
	require.Len(t, r.Problems, 1)

	r = Classify(w.st, Input{})
	require.Equal(t, 3, r.Mislinked)
}
