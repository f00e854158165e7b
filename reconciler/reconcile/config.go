package reconcile

import (
	"time"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/internal/service"
)

// Config is the reconciler's configuration; docs/configuration.md lists
// each variable.
type Config struct {
	// Both logins are the read-only role reconciler, one on each database.
	StudentDatabaseURL string // RECONCILER_STUDENT_DATABASE_URL (+ RECONCILER_STUDENT_DATABASE_PASSWORD)
	UsersDatabaseURL   string // RECONCILER_USERS_DATABASE_URL (+ RECONCILER_USERS_DATABASE_PASSWORD)
	// SenderCaller is the sender's caller name among Users' callers: only
	// its inbox rows answer for students' keys, and users made under
	// another caller's keys (an operator with curl) belong to that caller.
	SenderCaller string // RECONCILER_SENDER_CALLER

	StuckAfter   time.Duration // RECONCILER_STUCK_AFTER
	RetryHorizon time.Duration // RECONCILER_RETRY_HORIZON
	Interval     time.Duration // RECONCILER_INTERVAL: incremental passes
	FullEvery    time.Duration // RECONCILER_FULL_EVERY: full sweeps
	PageSize     int           // RECONCILER_PAGE_SIZE
	PagePause    time.Duration // RECONCILER_PAGE_PAUSE
	// StatementTimeout is the server's statement_timeout on the
	// reconciler's connections: no read it makes runs longer.
	StatementTimeout time.Duration // RECONCILER_STATEMENT_TIMEOUT

	// AdminAddr serves /metrics, /healthz, /readyz and /report in serve
	// mode, with the sender's admin port's rules: loopback by default, the
	// host names AdminAllowedHosts lists beside it, and /report only with
	// a token of Operators (it names students and users by id).
	AdminAddr         string            // RECONCILER_ADMIN_ADDR
	AdminAllowedHosts []string          // RECONCILER_ADMIN_ALLOWED_HOSTS
	Operators         []auth.Credential // RECONCILER_ADMIN_TOKENS or RECONCILER_ADMIN_TOKENS_FILE

	LogLevel string // LOG_LEVEL
}

// LoadConfig reads Config through getenv. The Reader it returns lists the
// variables read, for the tests that check docker-compose.yml and the
// configuration page.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	studentDB, _ := e.DatabaseLogin("RECONCILER_STUDENT_DATABASE_URL",
		"postgres://"+migrations.Reconciler+"@localhost:5432/student?sslmode=disable", "RECONCILER_STUDENT_DATABASE_PASSWORD")
	usersDB, _ := e.DatabaseLogin("RECONCILER_USERS_DATABASE_URL",
		"postgres://"+migrations.Reconciler+"@localhost:5432/users?sslmode=disable", "RECONCILER_USERS_DATABASE_PASSWORD")
	c := Config{
		StudentDatabaseURL: studentDB,
		UsersDatabaseURL:   usersDB,
		SenderCaller:       e.String("RECONCILER_SENDER_CALLER", "outbox-sender"),
		// A row the sender retries with the default backoff is tried again
		// within minutes; a quarter of an hour unlinked means it is waiting
		// on something (Users down, a full broker, no sender).
		StuckAfter: e.Duration("RECONCILER_STUCK_AFTER", 15*time.Minute, time.Second, 30*24*time.Hour),
		// The sender's SENDER_MAX_AGE (72h) and an hour: by then it has
		// given up on a key, and an answer still unrecorded will stay so.
		RetryHorizon: e.Duration("RECONCILER_RETRY_HORIZON", 73*time.Hour, time.Second, 10*365*24*time.Hour),
		Interval:     e.Duration("RECONCILER_INTERVAL", time.Minute, time.Second, 24*time.Hour),
		FullEvery:    e.Duration("RECONCILER_FULL_EVERY", time.Hour, time.Second, 30*24*time.Hour),
		// A page is three short statements, one on Student's database and
		// two on Users': a thousand rows is a few milliseconds of work for
		// each, and the pause leaves the databases to the services between
		// pages.
		PageSize:  e.Int("RECONCILER_PAGE_SIZE", 1000, 1, 100_000),
		PagePause: e.Duration("RECONCILER_PAGE_PAUSE", 20*time.Millisecond, 0, time.Minute),
		// A page's statement takes milliseconds; seconds mean the database
		// is in trouble, and the reconciler should not add to it.
		StatementTimeout: e.Duration("RECONCILER_STATEMENT_TIMEOUT", 5*time.Second, 100*time.Millisecond, 10*time.Minute),

		// Loopback: /report names students and users. A deployment that
		// scrapes from elsewhere opens it and names the scraper's host.
		AdminAddr:         e.String("RECONCILER_ADMIN_ADDR", "127.0.0.1:8092"),
		AdminAllowedHosts: e.Hosts("RECONCILER_ADMIN_ALLOWED_HOSTS"),
		LogLevel:          e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
	}
	e.Check(auth.IsCallerName(c.SenderCaller),
		"RECONCILER_SENDER_CALLER=%q: want a caller name (lowercase letters, digits and hyphens, up to 32)", c.SenderCaller)
	e.Check(c.Interval <= c.FullEvery,
		"RECONCILER_INTERVAL=%s must not exceed RECONCILER_FULL_EVERY=%s: the incremental passes run between full ones", c.Interval, c.FullEvery)
	c.Operators = auth.CallersVar(e, "RECONCILER_ADMIN_TOKENS", "operator", "name:token")
	// GOMAXPROCS is Go's own, applied by main (service.SetProcs); a bad one
	// is reported here, with the rest.
	service.CheckProcs(e, getenv)
	return c, e, e.Err()
}
