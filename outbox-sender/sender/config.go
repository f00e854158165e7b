package sender

import (
	"fmt"
	"os"
	"time"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
)

// Config is the sender's configuration; docs/configuration.md lists each
// variable.
type Config struct {
	DatabaseURL    string        // SENDER_DATABASE_URL: Student's database
	UsersURL       string        // SENDER_USERS_URL
	AdminAddr      string        // SENDER_ADMIN_ADDR
	ID             string        // SENDER_ID
	LogLevel       string        // LOG_LEVEL
	BatchSize      int           // SENDER_BATCH_SIZE
	Concurrency    int           // SENDER_CONCURRENCY
	PollInterval   time.Duration // SENDER_POLL_INTERVAL
	Lease          time.Duration // SENDER_LEASE
	RequestTimeout time.Duration // SENDER_REQUEST_TIMEOUT
	MaxAttempts    int           // SENDER_MAX_ATTEMPTS
	BackoffMin     time.Duration // SENDER_BACKOFF_MIN
	BackoffMax     time.Duration // SENDER_BACKOFF_MAX
	MaxAge         time.Duration // SENDER_MAX_AGE
	// UsersInboxRetention is how long the Users the sender calls keeps a
	// key (its USERS_INBOX_RETENTION): a retry redrive is refused for a
	// key too old for Users to remember until the retry ends.
	UsersInboxRetention time.Duration // SENDER_USERS_INBOX_RETENTION
	// Delivered rows are deleted after DeliveredRetention, so the outbox
	// stays small; dead rows are kept until a person redrives them.
	DeliveredRetention time.Duration // SENDER_DELIVERED_RETENTION
	PurgeInterval      time.Duration // SENDER_PURGE_INTERVAL
	// ParkedRetention is how long a reply the sender parked is kept.
	ParkedRetention time.Duration // SENDER_PARKED_RETENTION

	// DatabaseTimeout is the server's statement_timeout on the sender's
	// connections: it bounds each claim and each statement that records
	// answers.
	DatabaseTimeout time.Duration // SENDER_DATABASE_TIMEOUT

	// UsersToken is the bearer token the sender authenticates to Users
	// with. Serving needs it (Run checks); "dead" and "healthcheck" do not.
	UsersToken auth.Secret // SENDER_USERS_TOKEN or SENDER_USERS_TOKEN_FILE

	// AdminMaxConns caps the admin port's open connections.
	AdminMaxConns int // SENDER_ADMIN_MAX_CONNS
	// AdminAllowedHosts are the host names, besides loopback, the admin
	// port answers to (httpapi.AllowHosts).
	AdminAllowedHosts []string // SENDER_ADMIN_ALLOWED_HOSTS
	// Operators may use the outbox routes of the admin port, each with
	// its bearer token; a redrive is recorded as its operator's. With none,
	// those routes refuse everyone: /metrics and the health checks stay.
	Operators []auth.Credential // SENDER_ADMIN_TOKENS or SENDER_ADMIN_TOKENS_FILE
	// AdminDBMaxConns is the size of the admin port's own pool on
	// Student's database, apart from delivery's.
	AdminDBMaxConns int // SENDER_ADMIN_DB_MAX_CONNS
	// MaxRedrives is how many times one row may be redriven.
	MaxRedrives int // SENDER_MAX_REDRIVES

	// DBMaxConns is the size of the pool on Student's database. The
	// listener for notifications holds one more connection, outside it.
	DBMaxConns int // SENDER_DB_MAX_CONNS

	// Source is where new rows come from: "poll" (the table, woken by
	// notifications) or "cdc" (the write-ahead log, through a logical
	// replication slot; package cdc).
	Source string // SENDER_SOURCE
	// CDCDatabaseURL logs in to Student's database as the replication
	// role, with the password put in (SENDER_CDC_DATABASE_PASSWORD).
	CDCDatabaseURL string // SENDER_CDC_DATABASE_URL
	// CDCSlot is the logical replication slot's name. Slots belong to the
	// whole cluster: two Student databases in one cluster need two names.
	CDCSlot string // SENDER_CDC_SLOT
	// CDCGrace is how long, in cdc mode, the poll leaves a new row to the
	// stream before it claims it itself.
	CDCGrace time.Duration // SENDER_CDC_GRACE

	// Transport is how a row reaches Users: "http" (POST /users, the
	// answer in the response) or "nats" (a command on a JetStream stream,
	// Users' answer on another; package usersnats).
	Transport string // SENDER_TRANSPORT
	// NATSURL lists the broker's servers.
	NATSURL string // SENDER_NATS_URL
	// NATSPassword is the password of the sender's NATS user.
	NATSPassword auth.Secret // SENDER_NATS_PASSWORD or SENDER_NATS_PASSWORD_FILE
	// NATSAnswerWait is the least a published row waits for Users' answer
	// before it is published again.
	NATSAnswerWait time.Duration // SENDER_NATS_ANSWER_WAIT
	// NATSAdminUser and NATSAdminPassword log "provision-broker" in as the
	// broker's admin; delivery never uses them.
	NATSAdminUser     string      // SENDER_NATS_ADMIN_USER
	NATSAdminPassword auth.Secret // SENDER_NATS_ADMIN_PASSWORD or SENDER_NATS_ADMIN_PASSWORD_FILE
	// NATSReplicas is how many servers "provision-broker" keeps each
	// stream and consumer on.
	NATSReplicas int // SENDER_NATS_REPLICAS
	// NATSStreamMaxBytes is the byte limit "provision-broker" gives each
	// stream: the most unread commands (or answers) the broker holds.
	NATSStreamMaxBytes int // SENDER_NATS_STREAM_MAX_BYTES
}

// Transports to Users (SENDER_TRANSPORT).
const (
	TransportHTTP = "http"
	TransportNATS = "nats"
)

// Sources of new rows (SENDER_SOURCE).
const (
	SourcePoll = "poll"
	SourceCDC  = "cdc"
)

// LoadConfig reads Config through getenv. The Reader it returns lists the
// variables read, for the test that checks docker-compose.yml.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	// The sender logs in to Student's database as its own role, which may
	// touch only the outbox and the students' link to their user; the
	// password may come from a file.
	dbURL, _ := e.DatabaseLogin("SENDER_DATABASE_URL",
		"postgres://"+migrations.OutboxSender+"@localhost:5432/student?sslmode=disable", "SENDER_DATABASE_PASSWORD")
	c := Config{
		DatabaseURL: dbURL,
		UsersURL:    e.URL("SENDER_USERS_URL", "http://localhost:8081", "http", "https"),
		// Loopback: the outbox routes show students' names and Users'
		// errors. A deployment that opens it names the host its scraper and
		// operators use in SENDER_ADMIN_ALLOWED_HOSTS.
		AdminAddr:         e.String("SENDER_ADMIN_ADDR", "127.0.0.1:8082"),
		AdminAllowedHosts: e.Hosts("SENDER_ADMIN_ALLOWED_HOSTS"),
		ID: e.Computed("SENDER_ID", "hostname-pid", func() string {
			host, _ := os.Hostname()
			return fmt.Sprintf("%s-%d", host, os.Getpid())
		}),
		LogLevel:       e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
		BatchSize:      e.Int("SENDER_BATCH_SIZE", 100, 1, 10000),
		Concurrency:    e.Int("SENDER_CONCURRENCY", 32, 1, 1024),
		PollInterval:   e.Duration("SENDER_POLL_INTERVAL", 200*time.Millisecond, time.Millisecond, time.Minute),
		Lease:          e.Duration("SENDER_LEASE", 30*time.Second, time.Second, time.Hour),
		RequestTimeout: e.Duration("SENDER_REQUEST_TIMEOUT", 5*time.Second, 10*time.Millisecond, 10*time.Minute),
		// Shorter than SENDER_LEASE (checked below); a claim or a recording
		// statement takes milliseconds when the database is well.
		DatabaseTimeout: e.Duration("SENDER_DATABASE_TIMEOUT", 3*time.Second, 100*time.Millisecond, 10*time.Minute),
		// SENDER_MAX_AGE is the retry horizon that matters; the attempt cap
		// is a safety net, high enough that with the default backoff the
		// age limit is reached first: with equal jitter a capped delay is at
		// least 2m30s, so 72h holds at most about 1,730 attempts.
		MaxAttempts: e.Int("SENDER_MAX_ATTEMPTS", 10000, 1, 1_000_000),
		BackoffMin:  e.Duration("SENDER_BACKOFF_MIN", 500*time.Millisecond, time.Millisecond, time.Hour),
		BackoffMax:  e.Duration("SENDER_BACKOFF_MAX", 5*time.Minute, time.Millisecond, 24*time.Hour),
		MaxAge:      e.Duration("SENDER_MAX_AGE", 72*time.Hour, time.Second, 10*365*24*time.Hour),
		// Users' own default; a deployment that changes one changes both
		// (deploy/calls_test.go holds compose to it).
		UsersInboxRetention: e.Duration("SENDER_USERS_INBOX_RETENTION", 7*24*time.Hour, time.Minute, 10*365*24*time.Hour),
		// A week of delivered rows answers "what happened to this
		// student?" for the recent past; the history goes with them.
		DeliveredRetention: e.Duration("SENDER_DELIVERED_RETENTION", 7*24*time.Hour, time.Minute, 10*365*24*time.Hour),
		PurgeInterval:      e.Duration("SENDER_PURGE_INTERVAL", 10*time.Minute, time.Second, 24*time.Hour),
		// Long enough to be seen after a holiday; a person reads a parked
		// reply, nothing else does.
		ParkedRetention: e.Duration("SENDER_PARKED_RETENTION", 30*24*time.Hour, time.Minute, 10*365*24*time.Hour),

		// An operator or two, a Prometheus scraper and the healthcheck:
		// 64 is plenty, and bounds what a runaway script can hold open on
		// a process whose real work is delivery.
		AdminMaxConns: e.Int("SENDER_ADMIN_MAX_CONNS", 64, 1, 1_000_000),

		// The claimer and each of the four recorders hold one connection
		// at a time; the rest is for the purge and the outbox's metrics.
		DBMaxConns: e.Int("SENDER_DB_MAX_CONNS", 8, 2, 1000),
		// The operator's routes and readiness get a pool of their own, so
		// that however many requests an operator's script sends, they
		// queue for these connections and never for delivery's.
		AdminDBMaxConns: e.Int("SENDER_ADMIN_DB_MAX_CONNS", 2, 1, 100),
		MaxRedrives:     e.Int("SENDER_MAX_REDRIVES", deadletter.DefaultMaxRedrives, 1, 1000),

		Source: e.OneOf("SENDER_SOURCE", SourcePoll, SourcePoll, SourceCDC),
		// A replication slot name: lower-case letters, digits and
		// underscores, at most 63 (NAMEDATALEN - 1).
		CDCSlot: e.String("SENDER_CDC_SLOT", "outbox_sender"),
		// Long enough that the stream, which claims a row within
		// milliseconds of its commit, is never raced by the poll for it;
		// short enough that a row the stream missed (its slot was dropped,
		// say) waits seconds, not minutes.
		CDCGrace: e.Duration("SENDER_CDC_GRACE", 10*time.Second, 100*time.Millisecond, time.Hour),

		Transport: e.OneOf("SENDER_TRANSPORT", TransportHTTP, TransportHTTP, TransportNATS),
		NATSURL:   e.URLList("SENDER_NATS_URL", "nats://localhost:4222", "nats", "tls"),
		// Users answers within milliseconds when it is up; the wait only
		// bounds how soon a command the broker lost (or Users parked) is
		// published again. It grows with the attempts, as a retry's
		// backoff does.
		NATSAnswerWait: e.Duration("SENDER_NATS_ANSWER_WAIT", 30*time.Second, 100*time.Millisecond, 24*time.Hour),
		NATSAdminUser:  e.String("SENDER_NATS_ADMIN_USER", "admin"),
		NATSReplicas:   e.Int("SENDER_NATS_REPLICAS", 1, 1, 5),
		// About two million commands unread: hours of a Users outage at
		// hundreds a second.
		NATSStreamMaxBytes: e.Int("SENDER_NATS_STREAM_MAX_BYTES", int(natsbus.DefaultStreams.MaxBytes), 1<<20, 1<<40),
	}
	c.CDCDatabaseURL, _ = e.DatabaseLogin("SENDER_CDC_DATABASE_URL",
		"postgres://"+migrations.OutboxCDC+"@localhost:5432/student?sslmode=disable", "SENDER_CDC_DATABASE_PASSWORD")
	e.Check(validSlotName(c.CDCSlot),
		"SENDER_CDC_SLOT=%q: want 1 to 63 lower-case letters, digits or underscores (PostgreSQL's rule for slot names)", c.CDCSlot)
	c.UsersToken = auth.TokenVar(e, "SENDER_USERS_TOKEN")
	c.NATSPassword = auth.TokenVar(e, "SENDER_NATS_PASSWORD")
	c.NATSAdminPassword = auth.TokenVar(e, "SENDER_NATS_ADMIN_PASSWORD")
	c.Operators = auth.CallersVar(e, "SENDER_ADMIN_TOKENS", "operator", "name:token")
	// Users must remember a key for the whole retry horizon, or a retry
	// it forgot would look like a new operation.
	e.Check(c.KeyWindow() > 0,
		"SENDER_USERS_INBOX_RETENTION=%s must be longer than SENDER_MAX_AGE=%s plus SENDER_LEASE=%s, SENDER_REQUEST_TIMEOUT=%s and %s for the clocks: Users must remember a key for as long as the sender may send it",
		c.UsersInboxRetention, c.MaxAge, c.Lease, c.RequestTimeout, deadletter.KeyClockSlack)
	e.Check(c.BackoffMin <= c.BackoffMax, "SENDER_BACKOFF_MIN=%s must not exceed SENDER_BACKOFF_MAX=%s", c.BackoffMin, c.BackoffMax)
	// A claimed row waits for a free worker at most one batch's worth of
	// requests, then takes at most one request timeout. The lease must cover
	// that, or a second sender would deliver the row while the first still is.
	worst := c.RequestTimeout * time.Duration(2+c.BatchSize/c.Concurrency)
	e.Check(c.Lease >= worst,
		"SENDER_LEASE=%s is too short: with SENDER_REQUEST_TIMEOUT=%s, SENDER_BATCH_SIZE=%d and SENDER_CONCURRENCY=%d a claimed row may take up to %s",
		c.Lease, c.RequestTimeout, c.BatchSize, c.Concurrency, worst)
	// The check above also keeps SENDER_REQUEST_TIMEOUT < SENDER_LEASE.
	// A claim stamps its rows' lease from the moment it started: a claim
	// that ran longer than the lease would hand out rows already due again,
	// which a second sender could then deliver at the same time.
	e.Check(c.DatabaseTimeout < c.Lease,
		"SENDER_DATABASE_TIMEOUT=%s must be shorter than SENDER_LEASE=%s: a claim that outlasts the lease hands out rows another sender may claim too",
		c.DatabaseTimeout, c.Lease)
	// GOMAXPROCS is Go's own, applied by main (service.SetProcs); a bad one
	// is reported here, with the rest.
	service.CheckProcs(e, getenv)
	return c, e, e.Err()
}

// validSlotName is PostgreSQL's rule for a replication slot's name.
func validSlotName(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// KeyWindow is how long after its key was minted a dead row may still be
// retried with it. A retry's last claim comes up to SENDER_MAX_AGE after
// it starts, its send within the lease, and the request reaches Users
// within the request timeout: Users must remember the key until then, by
// a clock that may be a little off Student's.
func (c Config) KeyWindow() time.Duration {
	return c.UsersInboxRetention - c.MaxAge - c.Lease - c.RequestTimeout - deadletter.KeyClockSlack
}
