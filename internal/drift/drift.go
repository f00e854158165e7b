// Package drift is the one definition of the pattern's invariant: what it
// means, judged from the rows of both databases, for a student to be
// linked to its one user, still on its way, rightly given up on, or lost,
// mislinked or linked to a user that does not exist; for a user to belong
// to nobody; for a document number to have two enabled users; and for an
// answer Users stored to have been forgotten by Student.
//
// Three readers judge with it, so that they cannot disagree: the
// reconciler (reconciler/), which checks a running deployment page by
// page; the fault suite's checker (testkit/invariant), which judges a
// system that has gone quiet after a fault; and the fault lab (lab/),
// which shows the verdict live. Each reads the rows its own way; what the
// rows mean is decided here, by pure functions over them.
//
// Nothing here says a document number or a name: a judgement's reason
// names ids only, so that it may be logged or shown.
package drift

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/outbox"
)

// Student is a row of Student's students table.
type Student struct {
	ID             uuid.UUID
	DocumentNumber string
	UserID         uuid.NullUUID
}

// Outbox is a student's create-user outbox row, as far as the judgement
// needs it.
type Outbox struct {
	Key         string // the idempotency key sent on every delivery
	State       string // outbox.StatePending, and so on
	ReasonClass string // why the row is dead (or why its last attempt failed)
	// LastError is the full message, for a reader allowed to see it; ""
	// for one that reads only the reason class.
	LastError string
}

// Answer is what Users stored in its inbox under a key, for the sender's
// caller: keys are scoped by caller, and another caller's row under the
// same key answers nothing about the student.
type Answer struct {
	StatusCode int           // 0 while no outcome is stored
	UserID     uuid.NullUUID // the user created, if any (inbox.resource_id)
}

// User is a row of Users' users table.
type User struct {
	ID             uuid.UUID
	DocumentNumber string
	Enabled        bool
}

// Facts are what one student's judgement reads.
type Facts struct {
	Student Student
	Outbox  *Outbox // nil: the student has no create-user outbox row
	// Answer is what Users stored under the outbox row's key; nil when it
	// stored nothing (or the student has no outbox row).
	Answer *Answer
	// Users are the users Users has among those the student's link and the
	// answer name, by id. A name missing here is a user Users does not have.
	Users map[uuid.UUID]User
}

// Rules are what a reader knows about the rows that the rows cannot say.
type Rules struct {
	// MayBePurged: retention may have deleted rows the judgement would
	// compare with. A running system purges delivered outbox rows
	// (SENDER_DELIVERED_RETENTION) and old inbox rows
	// (USERS_INBOX_RETENTION), so a linked student without them can only
	// be judged by its user: it must exist and carry the student's document
	// number. The fault suite, whose runs are far shorter than any
	// retention, leaves it false and holds every link to the answer
	// stored under its key.
	MayBePurged bool
	// Recent says whether a user may have been created after Student was
	// read (the two databases cannot be read at one instant): a dead row
	// whose key made a recent user was redriven and delivered since, and is
	// on its way rather than lost. Nil: no user is recent.
	Recent func(uuid.UUID) bool
}

func (r Rules) recent(id uuid.UUID) bool { return r.Recent != nil && r.Recent(id) }

// Verdict is the judgement on one student.
type Verdict string

const (
	// Linked: the student's user_id is the user Users stored under its key,
	// and that user exists with the student's document number.
	Linked Verdict = "linked"
	// Pending: on its way. The outbox row waits to be delivered (pending),
	// or the broker holds its command and Users' answer has not come back
	// (published): a published row is due again under the same key if the
	// answer never comes, so it is no more lost than a pending one.
	Pending Verdict = "pending"
	// Dead: the outbox row was dead-lettered with a reason and Users
	// created no user for its key. An operator decides what happens next.
	Dead Verdict = "dead"
	// Lost: committed, never linked, and not rightly dead-lettered: the row
	// was marked delivered without a link, has no outbox row at all, was
	// dead-lettered without a reason, or was dead-lettered although Users
	// did create its user. Nothing will ever link it by itself.
	Lost Verdict = "lost"
	// Mislinked: user_id is set, but to a user other than the one Users
	// stored under the student's key (or Users stored none), or to a user
	// that carries another document number.
	Mislinked Verdict = "mislinked"
	// MissingUser: user_id names a user Users does not have.
	MissingUser Verdict = "missing-user"
)

// Judgement is a Verdict with its reason, which names ids only.
type Judgement struct {
	Verdict Verdict
	Why     string
}

// InFlight says whether a row in state is still on its way to Users.
func InFlight(state string) bool {
	return state == outbox.StatePending || state == outbox.StatePublished
}

// Judge judges one student. The order of the cases is the definition: a
// link is judged by what it links to; an unlinked student by its outbox
// row and by what Users stored under the row's key.
func Judge(f Facts, r Rules) Judgement {
	s, o := f.Student, f.Outbox
	switch {
	case s.UserID.Valid:
		return judgeLink(f, r)
	case o == nil:
		return Judgement{Lost, fmt.Sprintf("student %s has no create-user outbox row", s.ID)}
	case InFlight(o.State):
		return Judgement{Pending, ""}
	case o.State == outbox.StateDead:
		made := f.Answer != nil && f.Answer.UserID.Valid
		switch {
		case made && r.recent(f.Answer.UserID.UUID):
			return Judgement{Pending, ""} // redriven since Student was read, and delivered
		case made:
			return Judgement{Lost, fmt.Sprintf("student %s was dead-lettered (%s) although Users created user %s under key %s",
				s.ID, reasonOf(o), f.Answer.UserID.UUID, o.Key)}
		case o.ReasonClass == "" && o.LastError == "":
			return Judgement{Lost, fmt.Sprintf("student %s was dead-lettered without a reason", s.ID)}
		}
		return Judgement{Dead, ""}
	case f.Answer != nil && f.Answer.UserID.Valid:
		return Judgement{Lost, fmt.Sprintf("student %s: outbox row is %s but user_id is unset; Users created %s under key %s",
			s.ID, o.State, f.Answer.UserID.UUID, o.Key)}
	}
	return Judgement{Lost, fmt.Sprintf("student %s: outbox row is %s but user_id is unset and Users stored no user under key %s",
		s.ID, o.State, o.Key)}
}

// judgeLink judges a linked student: its user must exist, be the one
// Users stored under its key, and carry its document number.
func judgeLink(f Facts, r Rules) Judgement {
	s, o, a, id := f.Student, f.Outbox, f.Answer, f.Student.UserID.UUID
	u, ok := f.Users[id]
	if !ok {
		return Judgement{MissingUser, fmt.Sprintf("student %s is linked to %s, which Users does not have", s.ID, id)}
	}
	if !r.MayBePurged || (o != nil && a != nil) {
		switch {
		case o == nil:
			return Judgement{Mislinked, fmt.Sprintf("student %s is linked to %s but has no create-user outbox row", s.ID, id)}
		case a == nil || !a.UserID.Valid:
			return Judgement{Mislinked, fmt.Sprintf("student %s is linked to %s but Users stored no user under key %s", s.ID, id, o.Key)}
		case a.UserID.UUID != id:
			return Judgement{Mislinked, fmt.Sprintf("student %s is linked to %s but Users stored %s under key %s", s.ID, id, a.UserID.UUID, o.Key)}
		}
	}
	if u.DocumentNumber != s.DocumentNumber {
		return Judgement{Mislinked, fmt.Sprintf("student %s is linked to user %s, which carries another document number", s.ID, id)}
	}
	return Judgement{Linked, ""}
}

func reasonOf(o *Outbox) string {
	if o.ReasonClass != "" {
		return o.ReasonClass
	}
	return fmt.Sprintf("%q", o.LastError)
}

// Duplicated says whether users, all carrying one document number, hold
// more than one enabled user: the incident this project is built around,
// and what Users' unique index on enabled users' document numbers
// (users_one_enabled_per_document) forbids. A replica without that index,
// or a restore, can still have it. A disabled user is not a second one:
// an operator disables a user to make room for another (the runbook's
// poison row).
func Duplicated(users []User) bool {
	enabled := 0
	for _, u := range users {
		if u.Enabled {
			enabled++
		}
	}
	return enabled > 1
}

// Orphan says whether user u belongs to nobody: no student is linked to
// it and none carries the key Users created it under (accounted), it was
// not made under another caller's key (foreign: an operator with curl),
// and it is not recent, so that its student may simply not have been read
// yet. A disabled user is nobody's on purpose: the system never disables
// one, and an operator disables an orphan to take it out of use rather
// than delete it (a key in Users' inbox may still name it).
func Orphan(u User, accounted, foreign, recent bool) bool {
	return u.Enabled && !accounted && !foreign && !recent
}

// Unrecorded says whether Users' answer under a student's key, which
// created a user, was never recorded on the student (it is still
// unlinked) although it is older than the retry horizon: by then the
// sender has given up on the key, and once Users forgets it (its inbox
// retention) a retry would be refused as a second user. age is the
// answer's age.
func Unrecorded(a Answer, studentLinked bool, age, horizon time.Duration) bool {
	return a.UserID.Valid && !studentLinked && age > horizon
}
