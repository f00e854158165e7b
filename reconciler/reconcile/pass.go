package reconcile

import (
	"context"
	"fmt"
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

func compareIDs(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) }

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
