package sender

import (
	"fmt"
	"os"
	"time"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/envconfig"
)

// Crash points the sender offers the end-to-end suite.
const (
	// CrashAfterResponse: Users has answered (and committed), the answers
	// are not yet recorded in Student's database.
	CrashAfterResponse = "sender-after-response"
)

// Config is the sender's configuration; the README's table lists each
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
	Crash          *crashpoint.Set
}

// LoadConfig reads Config through getenv. The Reader it returns lists the
// variables read, for the test that checks docker-compose.yml.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	host, _ := os.Hostname()
	c := Config{
		DatabaseURL:    e.URL("SENDER_DATABASE_URL", "postgres://postgres@localhost:5432/student?sslmode=disable", "postgres", "postgresql"),
		UsersURL:       e.URL("SENDER_USERS_URL", "http://localhost:8081", "http", "https"),
		AdminAddr:      e.String("SENDER_ADMIN_ADDR", ":8082"),
		ID:             e.String("SENDER_ID", fmt.Sprintf("%s-%d", host, os.Getpid())),
		LogLevel:       e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
		BatchSize:      e.Int("SENDER_BATCH_SIZE", 100, 1, 10000),
		Concurrency:    e.Int("SENDER_CONCURRENCY", 32, 1, 1024),
		PollInterval:   e.Duration("SENDER_POLL_INTERVAL", 200*time.Millisecond, time.Millisecond, time.Minute),
		Lease:          e.Duration("SENDER_LEASE", 30*time.Second, time.Second, time.Hour),
		RequestTimeout: e.Duration("SENDER_REQUEST_TIMEOUT", 5*time.Second, 10*time.Millisecond, 10*time.Minute),
		// SENDER_MAX_AGE is the retry horizon that matters; the attempt cap
		// is a safety net, high enough that with the backoff cap the age
		// limit is reached first (72h at 5m between attempts is ~860).
		MaxAttempts: e.Int("SENDER_MAX_ATTEMPTS", 1000, 1, 1_000_000),
		BackoffMin:  e.Duration("SENDER_BACKOFF_MIN", 500*time.Millisecond, time.Millisecond, time.Hour),
		BackoffMax:  e.Duration("SENDER_BACKOFF_MAX", 5*time.Minute, time.Millisecond, 24*time.Hour),
		MaxAge:      e.Duration("SENDER_MAX_AGE", 72*time.Hour, time.Second, 10*365*24*time.Hour),
	}
	crash, err := crashpoint.Parse(e.String("CRASH_POINT", ""), CrashAfterResponse)
	e.Check(err == nil, "CRASH_POINT: %v", err)
	c.Crash = crash
	e.Check(c.BackoffMin <= c.BackoffMax, "SENDER_BACKOFF_MIN=%s must not exceed SENDER_BACKOFF_MAX=%s", c.BackoffMin, c.BackoffMax)
	// A claimed row waits for a free worker at most one batch's worth of
	// requests, then takes at most one request timeout. The lease must cover
	// that, or a second sender would deliver the row while the first still is.
	worst := c.RequestTimeout * time.Duration(2+c.BatchSize/c.Concurrency)
	e.Check(c.Lease >= worst,
		"SENDER_LEASE=%s is too short: with SENDER_REQUEST_TIMEOUT=%s, SENDER_BATCH_SIZE=%d and SENDER_CONCURRENCY=%d a claimed row may take up to %s",
		c.Lease, c.RequestTimeout, c.BatchSize, c.Concurrency, worst)
	return c, e, e.Err()
}
