package reconcile

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/drift"
	"github.com/outboxref/outboxref/reconciler/internal/studentread"
	"github.com/outboxref/outboxref/reconciler/internal/usersread"
)

// A pass's reading of users: the users nothing accounts for (orphans),
// and the document numbers that more than one enabled user carries.

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

// usersByID reads the users ids name.
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
