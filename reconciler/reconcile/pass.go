package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/reconciler/internal/studentread"
	"github.com/outboxref/outboxref/reconciler/internal/usersread"
)

// The kinds of pass.
const (
	KindFull        = "full"
	KindIncremental = "incremental"
)

// recentSlack is how far back from a database's clock a pass looks twice:
// an incremental pass rereads what changed this long before the last one
// began. It covers a transaction that commits after its timestamps were
// taken (bounded by the services' database timeouts, seconds) and a
// Student whose clock, which stamps created_at, runs behind its
// database's.
const recentSlack = time.Minute

// Bounds of a keyset range that has none.
var (
	beginning = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	forever   = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
)

// checker reads both databases and judges what it reads.
type checker struct {
	cfg            Config
	student, users *pgxpool.Pool
	sq             *studentread.Queries
	uq             *usersread.Queries
	// beforeRecheck, when set, runs between a pass's first reading and
	// its reading again of the suspects: a test's seam for a delivery that
	// lands between the two.
	beforeRecheck func()
}

func newChecker(cfg Config, student, users *pgxpool.Pool) *checker {
	return &checker{cfg: cfg, student: student, users: users, sq: studentread.New(), uq: usersread.New()}
}

// marks are each database's clock at the start of a pass: the next
// incremental pass reads what changed since.
type marks struct{ student, users time.Time }

// pass is one pass's work and findings.
type pass struct {
	c       *checker
	kind    string
	started time.Time
	clocks  marks
	found   cases
	// judged are the students, users and document numbers (documentKey)
	// the pass judged: an incremental pass replaces what was known of them.
	judged map[uuid.UUID]bool
	// complete are the classes the pass read whole: it replaces what was
	// known of them.
	complete []drift.Class
	// accounted are the users some student accounts for (a full pass): the
	// one it is linked to, and the one Users made under its key.
	accounted []uuid.UUID
	// Suspects are cases of the invariant's classes, read again before
	// they are reported: the two databases cannot be read at one instant,
	// and a delivery that landed between the reads (a dead row redriven and
	// delivered, say) must not be reported as drift.
	suspectStudents, suspectUsers map[uuid.UUID]bool
	suspectDocuments              map[string]bool

	studentStats, usersStats ReadStats
	students, users          int // judged
}

func (c *checker) newPass(kind string) *pass {
	return &pass{
		c: c, kind: kind, started: time.Now(), found: newCases(), judged: map[uuid.UUID]bool{},
		suspectStudents: map[uuid.UUID]bool{}, suspectUsers: map[uuid.UUID]bool{}, suspectDocuments: map[string]bool{},
	}
}

// full judges everything: every student, every user, every document
// number that enabled users carry.
func (c *checker) full(ctx context.Context) (*pass, error) {
	p := c.newPass(KindFull)
	p.complete = drift.Classes
	err := p.steps(ctx, p.readClocks, p.sweepStudents, p.sweepUsers, p.sweepDocuments, p.recheck)
	return p, err
}

// incremental judges what changed since the last pass began (since), and
// what may have become a case by the passing of time: the students created
// since, the rows delivered since, every dead row, every row on its way
// for longer than the stuck threshold, and the users made since, with
// their document numbers. A change that leaves no trace in those (a user
// deleted by hand, a student updated by hand) waits for the next full
// sweep.
func (c *checker) incremental(ctx context.Context, since marks) (*pass, error) {
	p := c.newPass(KindIncremental)
	p.complete = []drift.Class{drift.ClassStuck, drift.ClassDead}
	err := p.steps(ctx, p.readClocks,
		func(ctx context.Context) error { return p.studentsCreatedSince(ctx, since.student.Add(-recentSlack)) },
		func(ctx context.Context) error {
			return p.rowsInState(ctx, outbox.StateDelivered, since.student.Add(-recentSlack), forever)
		},
		func(ctx context.Context) error { return p.rowsInState(ctx, outbox.StateDead, beginning, forever) },
		func(ctx context.Context) error {
			// The row's state_at is its creation while it is on its way; the
			// judgement ages it by the student's created_at.
			before := p.clocks.student.Add(-c.cfg.StuckAfter).Add(recentSlack)
			if err := p.rowsInState(ctx, outbox.StatePending, beginning, before); err != nil {
				return err
			}
			return p.rowsInState(ctx, outbox.StatePublished, beginning, before)
		},
		func(ctx context.Context) error { return p.usersMadeSince(ctx, since.users.Add(-recentSlack)) },
		p.recheck)
	return p, err
}

func (p *pass) steps(ctx context.Context, steps ...func(context.Context) error) error {
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return fmt.Errorf("%w: %s pass: %w", errNotChecked, p.kind, err)
		}
	}
	return nil
}

// sread and uread run one statement on Student's or Users' database.
func sread[T any](ctx context.Context, p *pass, what string, f func(context.Context) ([]T, error)) ([]T, error) {
	return read(ctx, &p.studentStats, p.c.cfg.StatementTimeout, "Student's database: "+what, f)
}

func uread[T any](ctx context.Context, p *pass, what string, f func(context.Context) ([]T, error)) ([]T, error) {
	return read(ctx, &p.usersStats, p.c.cfg.StatementTimeout, "Users' database: "+what, f)
}

func (p *pass) readClocks(ctx context.Context) error {
	var err error
	p.clocks.student, err = one(ctx, &p.studentStats, p.c.cfg.StatementTimeout, "Student's database: clock",
		func(ctx context.Context) (time.Time, error) { return p.c.sq.StudentNow(ctx, p.c.student) })
	if err != nil {
		return err
	}
	p.clocks.users, err = one(ctx, &p.usersStats, p.c.cfg.StatementTimeout, "Users' database: clock",
		func(ctx context.Context) (time.Time, error) { return p.c.uq.UsersNow(ctx, p.c.users) })
	return err
}

// pages reads keyset pages with next until one comes back short, pausing
// between pages.
func (p *pass) pages(ctx context.Context, next func(context.Context) (int, error)) error {
	for {
		n, err := next(ctx)
		if err != nil {
			return err
		}
		if n < p.c.cfg.PageSize {
			return nil
		}
		if err := pause(ctx, p.c.cfg.PagePause); err != nil {
			return err
		}
	}
}

// sweepStudents judges every student, a page at a time in id order.
func (p *pass) sweepStudents(ctx context.Context) error {
	after := uuid.Nil
	return p.pages(ctx, func(ctx context.Context) (int, error) {
		rows, err := sread(ctx, p, "students", func(ctx context.Context) ([]studentread.StudentsAfterRow, error) {
			return p.c.sq.StudentsAfter(ctx, p.c.student, studentread.StudentsAfterParams{AfterID: after, PageSize: int32(p.c.cfg.PageSize)}) //nolint:gosec // at most 100,000 (config.go)
		})
		if err != nil || len(rows) == 0 {
			return 0, err
		}
		after = rows[len(rows)-1].ID
		return len(rows), p.judgeStudents(ctx, convert(rows), false)
	})
}

// studentsCreatedSince judges the students created since the given time.
func (p *pass) studentsCreatedSince(ctx context.Context, since time.Time) error {
	at, id := since, uuid.Nil
	return p.pages(ctx, func(ctx context.Context) (int, error) {
		rows, err := sread(ctx, p, "new students", func(ctx context.Context) ([]studentread.StudentsCreatedAfterRow, error) {
			return p.c.sq.StudentsCreatedAfter(ctx, p.c.student, studentread.StudentsCreatedAfterParams{
				AfterCreatedAt: at, AfterID: id, PageSize: int32(p.c.cfg.PageSize)}) //nolint:gosec // at most 100,000 (config.go)
		})
		if err != nil || len(rows) == 0 {
			return 0, err
		}
		at, id = rows[len(rows)-1].CreatedAt, rows[len(rows)-1].ID
		return len(rows), p.judgeStudents(ctx, convert(rows), false)
	})
}

// rowsInState judges the students whose create-user row is in state, with
// state_at in (after, before).
func (p *pass) rowsInState(ctx context.Context, state string, after, before time.Time) error {
	at, id := after, int64(0)
	return p.pages(ctx, func(ctx context.Context) (int, error) {
		rows, err := sread(ctx, p, state+" rows", func(ctx context.Context) ([]studentread.OutboxInStateAfterRow, error) {
			return p.c.sq.OutboxInStateAfter(ctx, p.c.student, studentread.OutboxInStateAfterParams{
				State: state, AfterAt: at, AfterID: id, Before: before, PageSize: int32(p.c.cfg.PageSize)}) //nolint:gosec // at most 100,000 (config.go)
		})
		if err != nil || len(rows) == 0 {
			return 0, err
		}
		at, id = rows[len(rows)-1].StateAt, rows[len(rows)-1].ID
		var ids []uuid.UUID
		for _, r := range rows {
			if !p.judged[r.StudentID] {
				ids = append(ids, r.StudentID)
			}
		}
		return len(rows), p.judgeStudentsByID(ctx, ids, false)
	})
}

// judgeStudentsByID reads the students ids name and judges them.
func (p *pass) judgeStudentsByID(ctx context.Context, ids []uuid.UUID, again bool) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := sread(ctx, p, "students by id", func(ctx context.Context) ([]studentread.StudentsByIDRow, error) {
		return p.c.sq.StudentsByID(ctx, p.c.student, ids)
	})
	if err != nil {
		return err
	}
	return p.judgeStudents(ctx, rows, again)
}

// studentRow is a student with its create-user outbox row, as every
// students query returns it.
type studentRow = studentread.StudentsByIDRow

// convert turns the rows of another students query, which have the same
// columns, into studentRows.
func convert[T studentread.StudentsAfterRow | studentread.StudentsCreatedAfterRow](rows []T) []studentRow {
	out := make([]studentRow, len(rows))
	for i, r := range rows {
		out[i] = studentRow(r)
	}
	return out
}

// answerRow is what Users stored under a key.
type answerRow = usersread.AnswersByKeysRow

// judgeStudents judges a page of students: it asks Users for just the
// page's keys and the users they name, then judges each student by
// drift's rules. A case of the invariant's classes is a suspect the first
// time (again false), and is read again before it is reported; the second
// time (again) it is reported.
func (p *pass) judgeStudents(ctx context.Context, rows []studentRow, again bool) error {
	answers, users, err := p.usersOf(ctx, rows)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, r := range rows {
		if !again {
			p.students++
		}
		p.judged[r.ID] = true
		f := drift.Facts{Student: drift.Student{ID: r.ID, DocumentNumber: r.DocumentNumber, UserID: r.UserID}, Users: users}
		var answer *answerRow
		if r.State.Valid {
			f.Outbox = &drift.Outbox{Key: r.IdempotencyKey.UUID.String(), State: r.State.String, ReasonClass: r.ReasonClass.String}
			if a, ok := answers[f.Outbox.Key]; ok {
				answer = &a
				f.Answer = &drift.Answer{StatusCode: int(a.StatusCode), UserID: a.ResourceID}
			}
		}
		if r.UserID.Valid {
			p.accounted = append(p.accounted, r.UserID.UUID)
		}
		if f.Answer != nil && f.Answer.UserID.Valid {
			p.accounted = append(p.accounted, f.Answer.UserID.UUID)
		}
		// A running system purges delivered outbox rows and old answers:
		// a link without them is judged by its user.
		j := drift.Judge(f, drift.Rules{MayBePurged: true})
		if class, ok := drift.StudentClass(j.Verdict, now.Sub(r.CreatedAt), p.c.cfg.StuckAfter); ok {
			p.record(class, r.ID, p.studentCase(class, r), again)
		}
		if answer != nil && drift.Unrecorded(*f.Answer, r.UserID.Valid, now.Sub(answer.CreatedAt), p.c.cfg.RetryHorizon) {
			p.record(drift.ClassUnrecordedAnswer, r.ID, caseInfo{since: answer.CreatedAt, ids: []uuid.UUID{r.ID}}, again)
		}
	}
	return nil
}

// record adds a case, or for a first sighting of the invariant's classes,
// a suspect to read again.
func (p *pass) record(class drift.Class, key uuid.UUID, info caseInfo, again bool) {
	if class.Invariant() && !again {
		p.suspectStudents[key] = true
		return
	}
	p.found.add(class, key, info)
}

// studentCase is a student's case of class: aged from its creation (a dead
// row from its death), and for a row that waits, what it waits on.
func (p *pass) studentCase(class drift.Class, r studentRow) caseInfo {
	info := caseInfo{since: r.CreatedAt, ids: []uuid.UUID{r.ID}}
	switch class {
	case drift.ClassDead:
		if r.DeadAt.Valid {
			info.since = r.DeadAt.Time
		}
		info.reason = cmp.Or(r.ReasonClass.String, "none")
	case drift.ClassStuck:
		info.reason = r.State.String
		if r.ReasonClass.String != "" {
			info.reason += "/" + r.ReasonClass.String
		}
	}
	return info
}

// usersOf asks Users what it stored under the rows' keys, for the sender's
// caller, and for the users the rows and those answers name.
func (p *pass) usersOf(ctx context.Context, rows []studentRow) (map[string]answerRow, map[uuid.UUID]drift.User, error) {
	var keys []string
	var ids []uuid.UUID
	for _, r := range rows {
		if r.IdempotencyKey.Valid {
			keys = append(keys, r.IdempotencyKey.UUID.String())
		}
		if r.UserID.Valid {
			ids = append(ids, r.UserID.UUID)
		}
	}
	answers := map[string]answerRow{}
	if len(keys) > 0 {
		found, err := uread(ctx, p, "answers by key", func(ctx context.Context) ([]answerRow, error) {
			return p.c.uq.AnswersByKeys(ctx, p.c.users, usersread.AnswersByKeysParams{Caller: p.c.cfg.SenderCaller, Keys: keys})
		})
		if err != nil {
			return nil, nil, err
		}
		for _, a := range found {
			answers[a.IdempotencyKey] = a
			if a.ResourceID.Valid {
				ids = append(ids, a.ResourceID.UUID)
			}
		}
	}
	users, err := p.usersByID(ctx, ids)
	return answers, users, err
}

func (p *pass) usersByID(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]drift.User, error) {
	users := map[uuid.UUID]drift.User{}
	if len(ids) == 0 {
		return users, nil
	}
	found, err := uread(ctx, p, "users by id", func(ctx context.Context) ([]usersread.UsersByIDRow, error) {
		return p.c.uq.UsersByID(ctx, p.c.users, ids)
	})
	for _, u := range found {
		users[u.ID] = drift.User{ID: u.ID, DocumentNumber: u.DocumentNumber, Enabled: u.Enabled}
	}
	return users, err
}

// sweepUsers reads every user, a page at a time in id order, and suspects
// of belonging to nobody each that no student accounted for in the sweep of
// students before it. A user made since the pass began is left to the next
// pass: its student was most likely read before it was linked, and each
// suspect costs a read of tables no index serves (orphans). One made
// before, whose student was read before it was linked, is cleared when it
// is read again.
func (p *pass) sweepUsers(ctx context.Context) error {
	slices.SortFunc(p.accounted, compareIDs)
	p.accounted = slices.Compact(p.accounted)
	recent := p.clocks.users
	after := uuid.Nil
	return p.pages(ctx, func(ctx context.Context) (int, error) {
		rows, err := uread(ctx, p, "users", func(ctx context.Context) ([]usersread.UsersAfterRow, error) {
			return p.c.uq.UsersAfter(ctx, p.c.users, usersread.UsersAfterParams{AfterID: after, PageSize: int32(p.c.cfg.PageSize)}) //nolint:gosec // at most 100,000 (config.go)
		})
		if err != nil || len(rows) == 0 {
			return 0, err
		}
		after = rows[len(rows)-1].ID
		for _, u := range rows {
			p.users++
			if _, ok := slices.BinarySearchFunc(p.accounted, u.ID, compareIDs); !ok && u.CreatedAt.Before(recent) {
				p.suspectUsers[u.ID] = true
			}
		}
		return len(rows), nil
	})
}

func compareIDs(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) }

// docUser is an enabled user of a document number.
type docUser struct {
	document string
	id       uuid.UUID
	created  time.Time
}

// sweepDocuments reads the enabled users in document order and suspects
// each document number that more than one of them carries.
func (p *pass) sweepDocuments(ctx context.Context) error {
	var group []docUser // the users of the document read last, which may go on in the next page
	afterDoc, afterID := "", uuid.Nil
	err := p.pages(ctx, func(ctx context.Context) (int, error) {
		rows, err := uread(ctx, p, "enabled users by document", func(ctx context.Context) ([]usersread.EnabledUsersAfterRow, error) {
			return p.c.uq.EnabledUsersAfter(ctx, p.c.users, usersread.EnabledUsersAfterParams{
				AfterDocument: afterDoc, AfterID: afterID, PageSize: int32(p.c.cfg.PageSize)}) //nolint:gosec // at most 100,000 (config.go)
		})
		if err != nil || len(rows) == 0 {
			return 0, err
		}
		afterDoc, afterID = rows[len(rows)-1].DocumentNumber, rows[len(rows)-1].ID
		for _, r := range rows {
			if len(group) > 0 && group[0].document != r.DocumentNumber {
				p.judgeDocument(group, false)
				group = group[:0]
			}
			group = append(group, docUser{r.DocumentNumber, r.ID, r.CreatedAt})
		}
		return len(rows), nil
	})
	if err == nil && len(group) > 0 {
		p.judgeDocument(group, false)
	}
	return err
}

// judgeDocument judges the enabled users of one document number: a
// suspect the first time, a case when read again.
func (p *pass) judgeDocument(group []docUser, again bool) {
	users := make([]drift.User, len(group))
	info := caseInfo{}
	for i, u := range group {
		users[i] = drift.User{ID: u.id, Enabled: true}
		info.ids = append(info.ids, u.id)
		// The case began when its last user was made.
		if u.created.After(info.since) {
			info.since = u.created
		}
	}
	key := documentKey(group[0].document)
	p.judged[key] = true
	if !drift.Duplicated(users) {
		return
	}
	if !again {
		p.suspectDocuments[group[0].document] = true
		return
	}
	slices.SortFunc(info.ids, compareIDs)
	p.found.add(drift.ClassDuplicateDocument, key, info)
}

// usersMadeSince judges the users whose answers were stored since the given
// time: one made under the sender's key that no student carries now is a
// suspect orphan; and their document numbers are judged again.
func (p *pass) usersMadeSince(ctx context.Context, since time.Time) error {
	at, caller, key := since, "", ""
	return p.pages(ctx, func(ctx context.Context) (int, error) {
		rows, err := uread(ctx, p, "new answers", func(ctx context.Context) ([]usersread.AnswersCreatedAfterRow, error) {
			return p.c.uq.AnswersCreatedAfter(ctx, p.c.users, usersread.AnswersCreatedAfterParams{
				AfterAt: at, AfterCaller: caller, AfterKey: key, PageSize: int32(p.c.cfg.PageSize)}) //nolint:gosec // at most 100,000 (config.go)
		})
		if err != nil || len(rows) == 0 {
			return 0, err
		}
		last := rows[len(rows)-1]
		at, caller, key = last.CreatedAt, last.Caller, last.IdempotencyKey
		var ids []uuid.UUID
		keyed := map[uuid.UUID]uuid.UUID{} // the sender's key → the user made under it
		for _, r := range rows {
			p.users++
			p.judged[r.ResourceID] = true
			ids = append(ids, r.ResourceID)
			if r.Caller != p.c.cfg.SenderCaller {
				continue // another caller's user is theirs
			}
			k, err := uuid.Parse(r.IdempotencyKey)
			if err != nil {
				p.suspectUsers[r.ResourceID] = true // no student's key looks like this
				continue
			}
			keyed[k] = r.ResourceID
		}
		if err := p.keysCarried(ctx, keyed); err != nil {
			return 0, err
		}
		for _, u := range keyed {
			p.suspectUsers[u] = true
		}
		return len(rows), p.documentsOf(ctx, ids)
	})
}

// keysCarried drops from keyed the keys some student's outbox row carries
// now: their users are accounted for.
func (p *pass) keysCarried(ctx context.Context, keyed map[uuid.UUID]uuid.UUID) error {
	if len(keyed) == 0 {
		return nil
	}
	keys := make([]uuid.UUID, 0, len(keyed))
	for k := range keyed {
		keys = append(keys, k)
	}
	carried, err := sread(ctx, p, "students by key", func(ctx context.Context) ([]studentread.StudentsByKeysRow, error) {
		return p.c.sq.StudentsByKeys(ctx, p.c.student, keys)
	})
	for _, c := range carried {
		delete(keyed, c.IdempotencyKey)
	}
	return err
}

// documentsOf judges the document numbers of the users ids name.
func (p *pass) documentsOf(ctx context.Context, ids []uuid.UUID) error {
	users, err := p.usersByID(ctx, ids)
	if err != nil {
		return err
	}
	var docs []string
	for _, u := range users {
		if u.Enabled && !slices.Contains(docs, u.DocumentNumber) {
			docs = append(docs, u.DocumentNumber)
		}
	}
	return p.judgeDocuments(ctx, docs, false)
}

// judgeDocuments reads the enabled users of docs and judges each document.
func (p *pass) judgeDocuments(ctx context.Context, docs []string, again bool) error {
	if len(docs) == 0 {
		return nil
	}
	rows, err := uread(ctx, p, "enabled users of documents", func(ctx context.Context) ([]usersread.EnabledUsersWithDocumentsRow, error) {
		return p.c.uq.EnabledUsersWithDocuments(ctx, p.c.users, docs)
	})
	if err != nil {
		return err
	}
	byDoc := map[string][]docUser{}
	for _, r := range rows {
		byDoc[r.DocumentNumber] = append(byDoc[r.DocumentNumber], docUser{r.DocumentNumber, r.ID, r.CreatedAt})
	}
	for _, doc := range docs {
		if group := byDoc[doc]; len(group) > 0 {
			p.judgeDocument(group, again)
		} else {
			p.judged[documentKey(doc)] = true // no enabled user any more: no case
		}
	}
	return nil
}

// recheck reads every suspect again and reports those still cases.
func (p *pass) recheck(ctx context.Context) error {
	if p.c.beforeRecheck != nil {
		p.c.beforeRecheck()
	}
	for batch := range slices.Chunk(sortedIDs(p.suspectStudents), p.c.cfg.PageSize) {
		if err := p.judgeStudentsByID(ctx, batch, true); err != nil {
			return err
		}
		if err := pause(ctx, p.c.cfg.PagePause); err != nil {
			return err
		}
	}
	for batch := range slices.Chunk(sortedIDs(p.suspectUsers), p.c.cfg.PageSize) {
		if err := p.orphans(ctx, batch); err != nil {
			return err
		}
		if err := pause(ctx, p.c.cfg.PagePause); err != nil {
			return err
		}
	}
	docs := make([]string, 0, len(p.suspectDocuments))
	for d := range p.suspectDocuments {
		docs = append(docs, d)
	}
	slices.Sort(docs)
	for batch := range slices.Chunk(docs, p.c.cfg.PageSize) {
		if err := p.judgeDocuments(ctx, batch, true); err != nil {
			return err
		}
	}
	return nil
}

func sortedIDs(set map[uuid.UUID]bool) []uuid.UUID {
	ids := make([]uuid.UUID, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, compareIDs)
	return ids
}

// orphans reads again, for each suspect user, everything that could
// account for it: a student linked to it, the answer that made it and
// whether a student carries that answer's key now; and reports those that
// nothing accounts for (drift.Orphan).
func (p *pass) orphans(ctx context.Context, ids []uuid.UUID) error {
	linked, err := sread(ctx, p, "students linked to users", func(ctx context.Context) ([]uuid.UUID, error) {
		return p.c.sq.StudentsLinkedTo(ctx, p.c.student, ids)
	})
	if err != nil {
		return err
	}
	answers, err := uread(ctx, p, "answers for users", func(ctx context.Context) ([]usersread.AnswersForUsersRow, error) {
		return p.c.uq.AnswersForUsers(ctx, p.c.users, ids)
	})
	if err != nil {
		return err
	}
	accounted, foreign := map[uuid.UUID]bool{}, map[uuid.UUID]bool{}
	for _, id := range linked {
		accounted[id] = true
	}
	keyed := map[uuid.UUID]uuid.UUID{}
	for _, a := range answers {
		if a.Caller != p.c.cfg.SenderCaller {
			foreign[a.ResourceID] = true
		} else if k, err := uuid.Parse(a.IdempotencyKey); err == nil {
			keyed[k] = a.ResourceID
		}
	}
	all := maps.Clone(keyed)
	if err := p.keysCarried(ctx, keyed); err != nil {
		return err
	}
	for k, u := range all {
		if _, left := keyed[k]; !left {
			accounted[u] = true
		}
	}
	found, err := uread(ctx, p, "users by id", func(ctx context.Context) ([]usersread.UsersByIDRow, error) {
		return p.c.uq.UsersByID(ctx, p.c.users, ids)
	})
	if err != nil {
		return err
	}
	for _, u := range found {
		if drift.Orphan(drift.User{ID: u.ID, DocumentNumber: u.DocumentNumber, Enabled: u.Enabled}, accounted[u.ID], foreign[u.ID], false) {
			p.found.add(drift.ClassOrphanUser, u.ID, caseInfo{since: u.CreatedAt, ids: []uuid.UUID{u.ID}})
		}
	}
	return nil
}
