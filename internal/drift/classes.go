package drift

import "time"

// Class is what the reconciler counts and reports: the class label of its
// metrics and the keys of its JSON report. The first two need an
// operator's attention but break nothing; the other six are the invariant
// broken ("drift").
type Class string

const (
	ClassStuck             Class = "stuck"
	ClassDead              Class = "dead"
	ClassLost              Class = "lost"
	ClassMislinked         Class = "mislinked"
	ClassMissingUser       Class = "missing-user"
	ClassOrphanUser        Class = "orphan-user"
	ClassDuplicateDocument Class = "duplicate-document"
	ClassUnrecordedAnswer  Class = "unrecorded-answer"
)

// Classes lists every class, those that need attention first.
var Classes = []Class{
	ClassStuck, ClassDead,
	ClassLost, ClassMislinked, ClassMissingUser, ClassOrphanUser, ClassDuplicateDocument, ClassUnrecordedAnswer,
}

// Invariant says whether a case of c breaks the invariant (is drift),
// rather than waiting for an operator.
func (c Class) Invariant() bool { return c != ClassStuck && c != ClassDead }

// Explanation says what a case of c is, for a report's reader.
func (c Class) Explanation() string { return explanations[c] }

var explanations = map[Class]string{
	ClassStuck: "A student still unlinked after the stuck threshold, its outbox row pending or published: Users is down or refusing, " +
		"the broker holds its command, or no sender runs. Nothing is broken yet; the reason class says what it waits for.",
	ClassDead: "An outbox row dead-lettered for a reason, and Users created no user for its key: it waits for an operator to redrive it.",
	ClassLost: "A student that will never get its user: its row was marked delivered without a link, it has no outbox row, " +
		"or its row was dead-lettered without a reason or although Users created its user.",
	ClassMislinked: "A student linked to a user other than the one Users stored under its key, or to a user with another document number.",
	ClassMissingUser: "A student linked to a user id Users does not have: a user deleted by hand, " +
		"or a Users database restored to before the user was made.",
	ClassOrphanUser: "An enabled user no student is linked to and no student's key made, and not made under another caller's key: " +
		"a delivery with a fresh key, a redrive with a new key after a lost answer, or a student deleted by hand. " +
		"Disabling it takes it out of use without deleting what names it.",
	ClassDuplicateDocument: "A document number with more than one enabled user: the incident this pattern exists to prevent.",
	ClassUnrecordedAnswer: "A key Users answered with a created user that Student never recorded, older than the retry horizon: " +
		"once Users forgets the key, nothing can link the student to that user.",
}

// StudentClass is the class a student's verdict counts in, if any: a
// pending student counts as stuck once it has been unlinked longer than
// stuckAfter; a linked one counts in none.
func StudentClass(v Verdict, unlinkedFor, stuckAfter time.Duration) (Class, bool) {
	switch v {
	case Pending:
		return ClassStuck, unlinkedFor > stuckAfter
	case Dead:
		return ClassDead, true
	case Lost:
		return ClassLost, true
	case Mislinked:
		return ClassMislinked, true
	case MissingUser:
		return ClassMissingUser, true
	}
	return "", false
}
