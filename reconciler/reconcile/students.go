package reconcile

import (
	"cmp"
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/reconciler/internal/studentread"
	"github.com/outboxref/outboxref/reconciler/internal/usersread"
)

// A pass's reading of students: each page of students is judged with
// what Users holds for just that page's keys and users.

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
