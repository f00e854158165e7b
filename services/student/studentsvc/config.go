package studentsvc

import (
	"time"

	"github.com/outboxref/outboxref/internal/envconfig"
)

// Config is Student's configuration; the README's table lists each variable.
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
}

// LoadConfig reads Config through getenv. The Reader it returns lists the
// variables read, for the test that checks docker-compose.yml.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	c := Config{
		HTTPAddr:        e.String("STUDENT_HTTP_ADDR", ":8080"),
		DatabaseURL:     e.DatabaseURL("STUDENT_DATABASE_URL", "postgres://postgres@localhost:5432/student?sslmode=disable"),
		LogLevel:        e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
		KeyWait:         e.Duration("STUDENT_IDEMPOTENCY_WAIT", 5*time.Second, 10*time.Millisecond, 20*time.Second),
		InboxRetention:  e.Duration("STUDENT_INBOX_RETENTION", 24*time.Hour, time.Minute, 10*365*24*time.Hour),
		PurgeInterval:   e.Duration("STUDENT_INBOX_PURGE_INTERVAL", 10*time.Minute, time.Second, 24*time.Hour),
		DatabaseTimeout: e.Duration("STUDENT_DATABASE_TIMEOUT", 8*time.Second, 100*time.Millisecond, 10*time.Minute),
	}
	// The wait for a key happens inside the transaction: a deadline no
	// longer than the wait would end it as "database unavailable" (503)
	// before it could end as "key in progress" (409).
	e.Check(c.KeyWait < c.DatabaseTimeout,
		"STUDENT_IDEMPOTENCY_WAIT=%s must be shorter than STUDENT_DATABASE_TIMEOUT=%s: the wait for a key happens inside a transaction bounded by the timeout",
		c.KeyWait, c.DatabaseTimeout)
	return c, e, e.Err()
}
