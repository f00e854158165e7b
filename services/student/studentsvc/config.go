package studentsvc

import (
	"time"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/internal/service"
)

// Config is Student's configuration; docs/configuration.md lists each variable.
type Config struct {
	HTTPAddr    string        // STUDENT_HTTP_ADDR
	DatabaseURL string        // STUDENT_DATABASE_URL
	LogLevel    string        // LOG_LEVEL
	KeyWait     time.Duration // STUDENT_IDEMPOTENCY_WAIT
	// DatabaseTimeout is the deadline of every transaction and read, and
	// the server's statement_timeout on Student's connections.
	DatabaseTimeout time.Duration // STUDENT_DATABASE_TIMEOUT
	// Client keys are kept long enough for a client's own retries, which
	// end within minutes; a day is generous and keeps the table small.
	InboxRetention time.Duration // STUDENT_INBOX_RETENTION
	PurgeInterval  time.Duration // STUDENT_INBOX_PURGE_INTERVAL

	// Only "migrate" uses these: an administrator's login (the password
	// may come from STUDENT_MIGRATE_DATABASE_PASSWORD), and the passwords
	// it gives the runtime roles of Student's database.
	MigrateDatabaseURL string          // STUDENT_MIGRATE_DATABASE_URL
	Logins             []service.Login // STUDENT_DATABASE_PASSWORD, SENDER_DATABASE_PASSWORD, SENDER_CDC_DATABASE_PASSWORD, LAB_STUDENT_DATABASE_PASSWORD, RECONCILER_STUDENT_DATABASE_PASSWORD

	// HTTPMaxConns caps the API's open connections (httpapi.LimitConns).
	HTTPMaxConns int // STUDENT_HTTP_MAX_CONNS
	// AdminAddr serves /metrics, /healthz and /readyz apart from the API,
	// so that the API's port need not be open to the scraper and the
	// metrics are not open to the API's clients.
	AdminAddr string // STUDENT_ADMIN_ADDR
	// AdminMaxConns caps the admin port's open connections.
	AdminMaxConns int // STUDENT_ADMIN_MAX_CONNS
	// AdminAllowedHosts are the host names, besides loopback, the admin
	// listener answers to (httpapi.AllowHosts): those its scraper and
	// health checks use when it listens beyond loopback.
	AdminAllowedHosts []string // STUDENT_ADMIN_ALLOWED_HOSTS
	// DBMaxConns is the size of the pool on Student's database.
	DBMaxConns int // STUDENT_DB_MAX_CONNS
	// Callers may call the API, each with its bearer token; each caller's
	// idempotency keys are its own. Serving needs at least one (Run checks:
	// "migrate" and "healthcheck" need none).
	Callers []auth.Credential // STUDENT_API_TOKENS or STUDENT_API_TOKENS_FILE
}

// LoadConfig reads Config through getenv. The Reader it returns lists the
// variables read, for the test that checks docker-compose.yml.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	// Student logs in as its own role; the password may come from a file.
	dbURL, password := e.DatabaseLogin("STUDENT_DATABASE_URL",
		"postgres://"+migrations.StudentApp+"@localhost:5432/student?sslmode=disable", "STUDENT_DATABASE_PASSWORD")
	c := Config{
		HTTPAddr: e.String("STUDENT_HTTP_ADDR", ":8080"),
		// Loopback: a deployment that scrapes from elsewhere opens it
		// and names its scraper's host in STUDENT_ADMIN_ALLOWED_HOSTS.
		AdminAddr:         e.String("STUDENT_ADMIN_ADDR", "127.0.0.1:8090"),
		AdminAllowedHosts: e.Hosts("STUDENT_ADMIN_ALLOWED_HOSTS"),
		DatabaseURL:       dbURL,
		LogLevel:          e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
		KeyWait:           e.Duration("STUDENT_IDEMPOTENCY_WAIT", 5*time.Second, 10*time.Millisecond, 20*time.Second),
		InboxRetention:    e.Duration("STUDENT_INBOX_RETENTION", 24*time.Hour, time.Minute, 10*365*24*time.Hour),
		PurgeInterval:     e.Duration("STUDENT_INBOX_PURGE_INTERVAL", 10*time.Minute, time.Second, 24*time.Hour),
		DatabaseTimeout:   e.Duration("STUDENT_DATABASE_TIMEOUT", 8*time.Second, 100*time.Millisecond, 10*time.Minute),

		// Far above what clients need at once, yet few enough that a flood
		// of connections cannot use up the file descriptors the database
		// pool needs (each connection also costs a goroutine and buffers).
		HTTPMaxConns: e.Int("STUDENT_HTTP_MAX_CONNS", 1024, 1, 1_000_000),
		// A scraper and the odd operator: as for the sender's admin port.
		AdminMaxConns: e.Int("STUDENT_ADMIN_MAX_CONNS", 64, 1, 1_000_000),
		// A request waits mostly for its commit's flush to disk, and
		// PostgreSQL flushes the commits of concurrent transactions together
		// (group commit): a pool too small to have several in flight pays
		// one flush per request. 16 was the knee of 4 to 48 under load.
		DBMaxConns: e.Int("STUDENT_DB_MAX_CONNS", 16, 1, 1000),
	}
	// The wait for a key happens inside the transaction: a deadline no
	// longer than the wait would end it as "database unavailable" (503)
	// before it could end as "key in progress" (409).
	e.Check(c.KeyWait < c.DatabaseTimeout,
		"STUDENT_IDEMPOTENCY_WAIT=%s must be shorter than STUDENT_DATABASE_TIMEOUT=%s: the wait for a key happens inside a transaction bounded by the timeout",
		c.KeyWait, c.DatabaseTimeout)
	c.Callers = auth.CallersVar(e, "STUDENT_API_TOKENS", "caller", "caller:token")
	c.MigrateDatabaseURL, _ = e.DatabaseLogin("STUDENT_MIGRATE_DATABASE_URL",
		"postgres://postgres@localhost:5432/student?sslmode=disable", "STUDENT_MIGRATE_DATABASE_PASSWORD")
	c.Logins = []service.Login{
		{Role: migrations.StudentApp, Variable: "STUDENT_DATABASE_PASSWORD", Password: password},
		{Role: migrations.OutboxSender, Variable: "SENDER_DATABASE_PASSWORD", Password: e.Secret("SENDER_DATABASE_PASSWORD")},
		// The sender's replication login, for SENDER_SOURCE=cdc. Made and
		// given its password even where the sender polls, so that switching
		// sources needs no second migration.
		{Role: migrations.OutboxCDC, Variable: "SENDER_CDC_DATABASE_PASSWORD", Password: e.Secret("SENDER_CDC_DATABASE_PASSWORD")},
		// Optional: without it the lab's reader cannot log in.
		{Role: migrations.LabReader, Variable: "LAB_STUDENT_DATABASE_PASSWORD", Password: e.Secret("LAB_STUDENT_DATABASE_PASSWORD")},
		// Optional too: without it the reconciler cannot log in.
		{Role: migrations.Reconciler, Variable: "RECONCILER_STUDENT_DATABASE_PASSWORD", Password: e.Secret("RECONCILER_STUDENT_DATABASE_PASSWORD")},
	}
	// GOMAXPROCS is Go's own, applied by main (service.SetProcs); a bad one
	// is reported here, with the rest.
	service.CheckProcs(e, getenv)
	return c, e, e.Err()
}
