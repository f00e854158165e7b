package usersvc

import (
	"time"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/internal/service"
)

// Config is Users' configuration; docs/configuration.md lists each variable.
type Config struct {
	HTTPAddr       string        // USERS_HTTP_ADDR
	DatabaseURL    string        // USERS_DATABASE_URL
	LogLevel       string        // LOG_LEVEL
	InboxRetention time.Duration // USERS_INBOX_RETENTION
	PurgeInterval  time.Duration // USERS_INBOX_PURGE_INTERVAL
	// ParkedRetention is how long a command Users parked is kept.
	ParkedRetention time.Duration // USERS_PARKED_RETENTION
	KeyWait         time.Duration // USERS_IDEMPOTENCY_WAIT
	// DatabaseTimeout is the deadline of every transaction and read, and
	// the server's statement_timeout on Users' connections.
	DatabaseTimeout time.Duration // USERS_DATABASE_TIMEOUT
	// Callers may call the API, each with its bearer token; each caller's
	// idempotency keys are its own. Serving needs at least one (Run checks:
	// "migrate" and "healthcheck" need none).
	Callers []auth.Credential // USERS_API_TOKENS or USERS_API_TOKENS_FILE

	// Only "migrate" uses these: an administrator's login (the password
	// may come from USERS_MIGRATE_DATABASE_PASSWORD), and the password it
	// gives users_app.
	MigrateDatabaseURL string          // USERS_MIGRATE_DATABASE_URL
	Logins             []service.Login // USERS_DATABASE_PASSWORD, LAB_USERS_DATABASE_PASSWORD, RECONCILER_USERS_DATABASE_PASSWORD

	// HTTPMaxConns caps the API's open connections (httpapi.LimitConns).
	HTTPMaxConns int // USERS_HTTP_MAX_CONNS
	// AdminAddr serves /metrics, /healthz and /readyz apart from the API,
	// which answers authenticated callers only.
	AdminAddr string // USERS_ADMIN_ADDR
	// AdminMaxConns caps the admin port's open connections.
	AdminMaxConns int // USERS_ADMIN_MAX_CONNS
	// AdminAllowedHosts are the host names, besides loopback, the admin
	// listener answers to (httpapi.AllowHosts): those its scraper and
	// health checks use when it listens beyond loopback.
	AdminAllowedHosts []string // USERS_ADMIN_ALLOWED_HOSTS
	// DBMaxConns is the size of the pool on Users' database.
	DBMaxConns int // USERS_DB_MAX_CONNS

	// NATSURL is the broker (comma-separated servers); with none, Users
	// takes commands over HTTP only.
	NATSURL string // USERS_NATS_URL
	// NATSPassword is the password of Users' NATS user (natsbus.UsersUser).
	NATSPassword auth.Secret // USERS_NATS_PASSWORD or USERS_NATS_PASSWORD_FILE
	// NATSCaller is the caller whose scope the broker's idempotency keys
	// live in: the sender's caller name over HTTP, so that a key first
	// sent over HTTP and then through the broker replays.
	NATSCaller string // USERS_NATS_CALLER
	// CommandMaxDeliveries is how many times a command Users cannot read is
	// delivered before it is parked.
	CommandMaxDeliveries int // USERS_COMMAND_MAX_DELIVERIES
}

// LoadConfig reads Config through getenv. The Reader it returns lists the
// variables read, for the test that checks docker-compose.yml.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	// Users logs in as its own role; the password may come from a file.
	dbURL, password := e.DatabaseLogin("USERS_DATABASE_URL",
		"postgres://"+migrations.UsersApp+"@localhost:5432/users?sslmode=disable", "USERS_DATABASE_PASSWORD")
	c := Config{
		HTTPAddr: e.String("USERS_HTTP_ADDR", ":8081"),
		// Loopback: a deployment that scrapes from elsewhere opens it
		// and names its scraper's host in USERS_ADMIN_ALLOWED_HOSTS.
		AdminAddr:         e.String("USERS_ADMIN_ADDR", "127.0.0.1:8091"),
		AdminAllowedHosts: e.Hosts("USERS_ADMIN_ALLOWED_HOSTS"),
		DatabaseURL:       dbURL,
		LogLevel:          e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
		InboxRetention:    e.Duration("USERS_INBOX_RETENTION", 7*24*time.Hour, time.Minute, 10*365*24*time.Hour),
		PurgeInterval:     e.Duration("USERS_INBOX_PURGE_INTERVAL", 10*time.Minute, time.Second, 24*time.Hour),
		// Long enough to be seen after a holiday; a person reads a parked
		// command, nothing else does.
		ParkedRetention: e.Duration("USERS_PARKED_RETENTION", 30*24*time.Hour, time.Minute, 10*365*24*time.Hour),
		// The wait is shorter than the sender's SENDER_REQUEST_TIMEOUT (5s),
		// so that the sender gets the 409 and its Retry-After instead of
		// giving up first (the compose test checks the pair).
		KeyWait:         e.Duration("USERS_IDEMPOTENCY_WAIT", 2*time.Second, 10*time.Millisecond, 20*time.Second),
		DatabaseTimeout: e.Duration("USERS_DATABASE_TIMEOUT", 4*time.Second, 100*time.Millisecond, 10*time.Minute),

		// As for Student. Each sender holds at most SENDER_CONCURRENCY (32)
		// connections, so 1024 leaves room for many senders and clients.
		HTTPMaxConns: e.Int("USERS_HTTP_MAX_CONNS", 1024, 1, 1_000_000),
		// As for Student.
		AdminMaxConns: e.Int("USERS_ADMIN_MAX_CONNS", 64, 1, 1_000_000),
		// As for Student. Users' load is the sender's deliveries, up to
		// SENDER_CONCURRENCY (32) at once: one connection for each, so that
		// a sender's deliveries never queue for a connection.
		DBMaxConns: e.Int("USERS_DB_MAX_CONNS", 32, 1, 1000),
	}
	c.Callers = auth.CallersVar(e, "USERS_API_TOKENS", "caller", "caller:token")
	c.NATSURL = e.URLList("USERS_NATS_URL", "", "nats", "tls", "ws", "wss")
	c.NATSPassword = auth.Secret(e.Secret("USERS_NATS_PASSWORD"))
	if c.NATSURL != "" {
		e.Require("USERS_NATS_PASSWORD", string(c.NATSPassword), "USERS_NATS_URL is set, and Users logs in to the broker as its own NATS user")
	}
	c.NATSCaller = e.String("USERS_NATS_CALLER", "outbox-sender")
	e.Check(auth.IsCallerName(c.NATSCaller),
		"USERS_NATS_CALLER=%q: want a caller name (lowercase letters, digits and hyphens, up to 32)", c.NATSCaller)
	// A few deliveries, not one: a command this Users cannot read may be
	// from a newer sender, and a newer Users rolling out beside this one
	// may read it on its next delivery. Not unbounded either: a command
	// nobody can read would come back for ever, and the operator should
	// see it parked.
	c.CommandMaxDeliveries = e.Int("USERS_COMMAND_MAX_DELIVERIES", 5, 1, 100)
	// The wait for a key happens inside the transaction: a deadline no
	// longer than the wait would end it as "database unavailable" (503)
	// before it could end as "key in progress" (409).
	e.Check(c.KeyWait < c.DatabaseTimeout,
		"USERS_IDEMPOTENCY_WAIT=%s must be shorter than USERS_DATABASE_TIMEOUT=%s: the wait for a key happens inside a transaction bounded by the timeout",
		c.KeyWait, c.DatabaseTimeout)
	c.MigrateDatabaseURL, _ = e.DatabaseLogin("USERS_MIGRATE_DATABASE_URL",
		"postgres://postgres@localhost:5432/users?sslmode=disable", "USERS_MIGRATE_DATABASE_PASSWORD")
	c.Logins = []service.Login{
		{Role: migrations.UsersApp, Variable: "USERS_DATABASE_PASSWORD", Password: password},
		// Optional: without it the lab's reader cannot log in.
		{Role: migrations.LabReader, Variable: "LAB_USERS_DATABASE_PASSWORD", Password: e.Secret("LAB_USERS_DATABASE_PASSWORD")},
		// Optional too: without it the reconciler cannot log in.
		{Role: migrations.Reconciler, Variable: "RECONCILER_USERS_DATABASE_PASSWORD", Password: e.Secret("RECONCILER_USERS_DATABASE_PASSWORD")},
	}
	// GOMAXPROCS is Go's own, applied by main (service.SetProcs); a bad one
	// is reported here, with the rest.
	service.CheckProcs(e, getenv)
	return c, e, e.Err()
}
