// Package invariant judges the system from its two databases: whether every
// student ended with exactly one user, linked to the one Users stored under
// the student's idempotency key. It trusts nothing the services say about
// themselves: only the rows count.
//
// Two readers share it: the fault-injection suite (e2e/), which judges a
// system that has gone quiet, and the fault lab (lab/), which shows the
// same verdict live while a person breaks the network. What each row
// means is not decided here but in internal/drift, which the shipped
// reconciler judges with too, so that the three cannot disagree about
// "lost", "duplicated" or "mislinked". This package keeps what only a test
// knows or wants: the students the test saw acknowledged, the keys it sent
// itself, what a scenario expects, whole-database loads, and the table the
// suite prints.
package invariant

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/outbox"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// StudentRow is a row of Student's students table.
type StudentRow = drift.Student

// OutboxRow is a create-user row of Student's outbox.
type OutboxRow struct {
	StudentID uuid.UUID
	Key       string // the idempotency key sent on every delivery
	State     string // pending, published, delivered or dead
	Attempts  int    // claims that may have led to a request, before and since redrives
	LastError string
	ClaimedBy string
}

// UserRow is a row of Users' users table.
type UserRow = drift.User

// InboxRow is a row of Users' inbox. Keys are scoped by caller: the same
// key from two callers is two rows.
type InboxRow struct {
	Caller     string // the authenticated caller that sent the key
	Key        string
	StatusCode int // 0 when no outcome is stored
	ResourceID uuid.NullUUID
	Replays    int
}

// State is everything the checker reads.
type State struct {
	Students []StudentRow
	Outbox   []OutboxRow
	Users    []UserRow
	Inbox    []InboxRow
}

// Input is what the test itself knows and the databases cannot tell.
type Input struct {
	// ForeignKeys are idempotency keys the test sent straight to Users (a
	// seeded user, the bursts of scenario 10). Users created under them
	// belong to no student and are counted as foreign, not unexpected.
	ForeignKeys []string
	// Caller is the sender's name among Users' callers (USERS_API_TOKENS).
	// When set, only its inbox rows answer for students' keys, and users
	// made under another caller's keys (an operator with curl) are counted
	// as foreign. Empty: every inbox row is the sender's.
	Caller string
	// Acked are the students Student answered 201 for. Each must exist:
	// an acknowledged commit that disappears is the worst kind of loss.
	Acked []uuid.UUID
	// Live says the system is still running (LoadLive): a pending row is
	// then normal, not a problem to describe, and a linked student whose
	// outbox or inbox row retention has purged is judged by its user alone
	// (drift.Rules.MayBePurged).
	Live bool
	// Recent are users a live read cannot judge yet (LoadLive): one that no
	// student accounts for is not counted as unexpected, and a dead row
	// whose key made one was redriven since, so it counts as pending.
	Recent map[uuid.UUID]bool
}

// Class is the verdict on one student: drift's, or Duplicated.
type Class = drift.Verdict

// The verdicts, as internal/drift defines them.
const (
	Linked      = drift.Linked
	Dead        = drift.Dead
	Pending     = drift.Pending // after the suite waited for quiescence this should never be seen
	Lost        = drift.Lost
	Mislinked   = drift.Mislinked
	MissingUser = drift.MissingUser
	// Duplicated: the student's document number has more than one enabled
	// user (drift.Duplicated). It takes precedence over the student's own
	// verdict: whichever user it is linked to, it has two.
	Duplicated Class = "duplicated"
)

// Report is the checker's verdict in numbers.
type Report struct {
	Students   int
	Linked     int
	Dead       int
	Pending    int
	Lost       int
	Duplicated int
	// Mislinked counts the students linked to the wrong user and those
	// linked to a user Users does not have (ByClass tells them apart).
	Mislinked int
	// Vanished counts students Student acknowledged with a 201 that are
	// not in its database.
	Vanished int

	Users      int
	Foreign    int // users created under Input.ForeignKeys
	Unexpected int // users no student and no foreign key accounts for

	// Redeliveries is the sum over outbox rows of attempts beyond the
	// first: how many times a row was claimed again after an attempt that
	// failed, timed out, or whose sender died.
	Redeliveries int
	// Replays is the sum of inbox.replays in Users: answers served from
	// the inbox instead of acting again.
	Replays int

	// ByClass maps each student to its verdict.
	ByClass map[uuid.UUID]Class
	// DeadReasons counts last_error values of dead rows.
	DeadReasons map[string]int
	// ClaimedBy counts delivered rows by the sender that claimed them last.
	ClaimedBy map[string]int
	// Problems describes the first few students and users that are not
	// right, for the failure message.
	Problems []string
}

// maxProblems bounds Report.Problems: a few examples say more than a wall.
const maxProblems = 15

func (r *Report) problem(format string, args ...any) {
	if len(r.Problems) < maxProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// Classify judges a State with drift's rules. It is a pure function so
// that its use of them can be tested on hand-built rows.
func Classify(st State, in Input) Report {
	r := Report{
		Students:    len(st.Students),
		Users:       len(st.Users),
		ByClass:     make(map[uuid.UUID]Class, len(st.Students)),
		DeadReasons: map[string]int{},
		ClaimedBy:   map[string]int{},
	}
	x := newIndex(&r, st, in)
	rules := drift.Rules{MayBePurged: in.Live, Recent: func(id uuid.UUID) bool { return in.Recent[id] }}
	// Users some student accounts for: the one it is linked to, and the
	// one Users stored under its key (which the student's own verdict
	// judges if the two differ).
	claimed := map[uuid.UUID]bool{}
	students := make(map[uuid.UUID]bool, len(st.Students))
	for _, s := range st.Students {
		students[s.ID] = true
		f := drift.Facts{Student: s, Users: x.users}
		o, hasOutbox := x.outbox[s.ID]
		if hasOutbox {
			f.Outbox = &drift.Outbox{Key: o.Key, State: o.State, LastError: o.LastError}
			if ib, ok := x.inbox[o.Key]; ok {
				f.Answer = &drift.Answer{StatusCode: ib.StatusCode, UserID: ib.ResourceID}
			}
		}
		if s.UserID.Valid {
			claimed[s.UserID.UUID] = true
		}
		if f.Answer != nil && f.Answer.UserID.Valid {
			claimed[f.Answer.UserID.UUID] = true
		}
		class := r.judge(f, rules, x, o, in.Live)
		r.ByClass[s.ID] = class
		r.count(class, o)
	}
	r.countUsers(st.Users, claimed, x.foreign, in.Recent)
	for _, id := range in.Acked {
		if !students[id] {
			r.Vanished++
			r.problem("vanished: Student answered 201 for student %s, which is not in its database", id)
		}
	}
	return r
}

// judge is one student's verdict, with the problem it describes.
func (r *Report) judge(f drift.Facts, rules drift.Rules, x index, o OutboxRow, live bool) Class {
	s := f.Student
	if docUsers := x.byDoc[s.DocumentNumber]; drift.Duplicated(docUsers) {
		ids := make([]string, len(docUsers))
		for i, u := range docUsers {
			ids[i] = u.ID.String()
		}
		r.problem("duplicated: student %s has %d users: %s", s.ID, len(docUsers), strings.Join(ids, ", "))
		return Duplicated
	}
	j := drift.Judge(f, rules)
	switch {
	case j.Why != "":
		r.problem("%s: %s", j.Verdict, j.Why)
	case j.Verdict == Pending && !live && drift.InFlight(o.State):
		r.problem("pending: student %s still waits for delivery (state %s, attempts %d, last error %q)", s.ID, o.State, o.Attempts, o.LastError)
	}
	return j.Verdict
}

// index is a State's rows by what Classify looks them up by.
type index struct {
	outbox  map[uuid.UUID]OutboxRow // by student
	inbox   map[string]InboxRow     // the students' caller's rows, by key
	foreign map[uuid.UUID]bool      // users created under another caller's or a foreign key
	users   map[uuid.UUID]UserRow
	byDoc   map[string][]UserRow // the enabled users, by document number
}

// newIndex indexes st, and counts on r what the rows say by themselves:
// redeliveries, replays, and who delivered.
func newIndex(r *Report, st State, in Input) index {
	x := index{
		outbox: make(map[uuid.UUID]OutboxRow, len(st.Outbox)), inbox: make(map[string]InboxRow, len(st.Inbox)),
		foreign: map[uuid.UUID]bool{}, users: make(map[uuid.UUID]UserRow, len(st.Users)), byDoc: map[string][]UserRow{},
	}
	for _, o := range st.Outbox {
		x.outbox[o.StudentID] = o
		r.Redeliveries += max(o.Attempts-1, 0)
		if o.State == outbox.StateDelivered {
			r.ClaimedBy[o.ClaimedBy]++
		}
	}
	for _, ib := range st.Inbox {
		r.Replays += ib.Replays
		// Users made under another caller's keys (an operator with curl),
		// or under keys the test names foreign, are someone else's.
		otherCaller := in.Caller != "" && ib.Caller != in.Caller
		if (otherCaller || slices.Contains(in.ForeignKeys, ib.Key)) && ib.ResourceID.Valid {
			x.foreign[ib.ResourceID.UUID] = true
		}
		if !otherCaller {
			x.inbox[ib.Key] = ib
		}
	}
	for _, u := range st.Users {
		x.users[u.ID] = u
		// Whoever made it, a second enabled user for a document number is
		// the incident (drift.Duplicated); a disabled one, such as the
		// operator's user the runbook's poison row disables, is not.
		if u.Enabled {
			x.byDoc[u.DocumentNumber] = append(x.byDoc[u.DocumentNumber], u)
		}
	}
	return x
}

// count adds one student's verdict to the totals.
func (r *Report) count(class Class, o OutboxRow) {
	switch class {
	case Linked:
		r.Linked++
	case Dead:
		r.Dead++
		r.DeadReasons[o.LastError]++
	case Pending:
		r.Pending++
	case Lost:
		r.Lost++
	case Duplicated:
		r.Duplicated++
	case Mislinked, MissingUser:
		r.Mislinked++
	}
}

// countUsers judges the users no student's verdict covers: foreign ones
// are someone else's; any other that no student accounts for is
// unexpected (drift.Orphan), unless its student may have been created
// after Student was read.
func (r *Report) countUsers(users []UserRow, claimed, foreign, recent map[uuid.UUID]bool) {
	for _, u := range users {
		switch {
		case foreign[u.ID]:
			r.Foreign++
		case drift.Orphan(u, claimed[u.ID], false, recent[u.ID]):
			r.Unexpected++
			r.problem("unexpected user %s: no student is linked to it and no key of a student or of the test stored it", u.ID)
		}
	}
}

// A Check is one invariant, as counted in a report, with what a count
// above zero would mean.
type Check struct {
	Name        string `json:"name"`
	Count       int    `json:"count"`
	Explanation string `json:"explanation"`
}

// Checks are the invariants that must hold at every moment, even while
// faults are on and rows are still pending: the fault lab shows them live.
func (r Report) Checks() []Check {
	return []Check{
		{"lost", r.Lost, "A student whose user will never come: it was marked delivered or dead-lettered without a link, or its outbox row is missing. The outbox exists to make this impossible."},
		{"duplicated", r.Duplicated, "A student whose document number has more than one enabled user. A retry that Users performed again instead of replaying its stored answer would make one."},
		{"mislinked", r.Mislinked, "A student linked to a user other than the one Users stored under the student's idempotency key (an answer recorded on the wrong row), or to a user Users does not have."},
		{"unexpected", r.Unexpected, "A user no student accounts for: created under a key no outbox row carries, as a delivery with a fresh key each attempt would do."},
	}
}

// Expect is what a scenario allows beyond the invariants.
type Expect struct {
	Dead int // dead-lettered rows the scenario provokes on purpose
}

// Violations lists what is wrong with a report. Lost, duplicated,
// mislinked, unexpected and vanished must be zero; nothing may still be
// pending once the system is quiet; and exactly the expected rows are dead.
func Violations(r Report, e Expect) []string {
	var v []string
	for _, c := range []struct {
		name string
		n    int
	}{
		{"lost", r.Lost}, {"duplicated", r.Duplicated}, {"mislinked", r.Mislinked},
		{"unexpected", r.Unexpected}, {"vanished", r.Vanished}, {"pending", r.Pending},
	} {
		if c.n != 0 {
			v = append(v, fmt.Sprintf("%s = %d, want 0", c.name, c.n))
		}
	}
	if r.Dead != e.Dead {
		v = append(v, fmt.Sprintf("dead = %d, want %d", r.Dead, e.Dead))
	}
	return v
}

// Table renders the report as a two-line table, the figures the docs
// quotes.
func (r Report) Table() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "students\tlinked\tdead\tpending\tlost\tduplicated\tmislinked\tvanished\t|\tusers\tforeign\tunexpected\t|\tredeliveries\treplays\t")
	fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t|\t%d\t%d\t%d\t|\t%d\t%d\t\n",
		r.Students, r.Linked, r.Dead, r.Pending, r.Lost, r.Duplicated, r.Mislinked, r.Vanished,
		r.Users, r.Foreign, r.Unexpected, r.Redeliveries, r.Replays)
	_ = w.Flush()
	if len(r.DeadReasons) > 0 {
		reasons := make([]string, 0, len(r.DeadReasons))
		for why, n := range r.DeadReasons {
			reasons = append(reasons, fmt.Sprintf("  %d × %s", n, why))
		}
		slices.Sort(reasons)
		b.WriteString("dead-letter reasons:\n" + strings.Join(reasons, "\n") + "\n")
	}
	if len(r.Problems) > 0 {
		b.WriteString("first problems:\n  " + strings.Join(r.Problems, "\n  ") + "\n")
	}
	return b.String()
}

// Load reads the state of both databases of a system that has gone quiet.
// Each database is read in one repeatable-read transaction, so the rows of
// one database are consistent with each other.
func Load(ctx context.Context, studentURL, usersURL string) (State, error) {
	var st State
	err := readURL(ctx, studentURL, func(tx pgx.Tx) error { return st.readStudent(ctx, tx) })
	if err != nil {
		return State{}, fmt.Errorf("read Student's database: %w", err)
	}
	err = readURL(ctx, usersURL, func(tx pgx.Tx) error { return st.readUsers(ctx, tx) })
	if err != nil {
		return State{}, fmt.Errorf("read Users' database: %w", err)
	}
	return st, nil
}

// Beginner is a database to read from: a *pgx.Conn or a *pgxpool.Pool.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// LoadLive reads a system that is still running, and returns it with the
// Input that judges it as such (Input.Live, Input.Recent). The two databases cannot be read at one
// instant, so a delivery may land between the two reads. Reading Users
// after Student means that every link Student shows is matched against an
// inbox at least as new. The users that appear only then may belong to a
// student created after Student was read, so Users is read once before as
// well: a user already there then was made for a student Student's read
// must show.
func LoadLive(ctx context.Context, student, users Beginner) (State, Input, error) {
	var before []uuid.UUID
	err := read(ctx, users, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id FROM users`)
		if err != nil {
			return err
		}
		before, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		return err
	})
	if err != nil {
		return State{}, Input{}, fmt.Errorf("read Users' database: %w", err)
	}
	var st State
	if err := read(ctx, student, func(tx pgx.Tx) error { return st.readStudent(ctx, tx) }); err != nil {
		return State{}, Input{}, fmt.Errorf("read Student's database: %w", err)
	}
	if err := read(ctx, users, func(tx pgx.Tx) error { return st.readUsers(ctx, tx) }); err != nil {
		return State{}, Input{}, fmt.Errorf("read Users' database: %w", err)
	}
	known := make(map[uuid.UUID]bool, len(before))
	for _, id := range before {
		known[id] = true
	}
	recent := map[uuid.UUID]bool{}
	for _, u := range st.Users {
		if !known[u.ID] {
			recent[u.ID] = true
		}
	}
	return st, Input{Live: true, Recent: recent}, nil
}

func (st *State) readStudent(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `SELECT id, document_number, user_id FROM students`)
	if err != nil {
		return fmt.Errorf("students: %w", err)
	}
	st.Students, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (StudentRow, error) {
		var s StudentRow
		return s, row.Scan(&s.ID, &s.DocumentNumber, &s.UserID)
	})
	if err != nil {
		return fmt.Errorf("students: %w", err)
	}
	// Every attempt the row had: a redrive counts attempts afresh.
	rows, err = tx.Query(ctx, `SELECT student_id, idempotency_key::text, state, attempts + attempts_before_redrive,
		coalesce(last_error, ''), coalesce(claimed_by, '') FROM outbox WHERE operation = $1`, outbox.OperationCreateUser)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	st.Outbox, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		return o, row.Scan(&o.StudentID, &o.Key, &o.State, &o.Attempts, &o.LastError, &o.ClaimedBy)
	})
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return nil
}

func (st *State) readUsers(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `SELECT id, document_number, enabled FROM users`)
	if err != nil {
		return fmt.Errorf("users: %w", err)
	}
	st.Users, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (UserRow, error) {
		var u UserRow
		return u, row.Scan(&u.ID, &u.DocumentNumber, &u.Enabled)
	})
	if err != nil {
		return fmt.Errorf("users: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT caller, idempotency_key, coalesce(status_code, 0), resource_id, replays FROM inbox`)
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	st.Inbox, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (InboxRow, error) {
		var ib InboxRow
		return ib, row.Scan(&ib.Caller, &ib.Key, &ib.StatusCode, &ib.ResourceID, &ib.Replays)
	})
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	return nil
}

func readURL(ctx context.Context, url string, f func(pgx.Tx) error) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return read(ctx, conn, f)
}

func read(ctx context.Context, db Beginner, f func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, f)
}
