package usersvc

import (
	"time"

	"github.com/outboxref/outboxref/internal/envconfig"
)

// Config is Users' configuration; the README's table lists each variable.
type Config struct {
	HTTPAddr       string        // USERS_HTTP_ADDR
	DatabaseURL    string        // USERS_DATABASE_URL
	LogLevel       string        // LOG_LEVEL
	InboxRetention time.Duration // USERS_INBOX_RETENTION
	PurgeInterval  time.Duration // USERS_INBOX_PURGE_INTERVAL
	KeyWait        time.Duration // USERS_IDEMPOTENCY_WAIT
}

// LoadConfig reads Config through getenv. The Reader it returns lists the
// variables read, for the test that checks docker-compose.yml.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	c := Config{
		HTTPAddr:       e.String("USERS_HTTP_ADDR", ":8081"),
		DatabaseURL:    e.DatabaseURL("USERS_DATABASE_URL", "postgres://postgres@localhost:5432/users?sslmode=disable"),
		LogLevel:       e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
		InboxRetention: e.Duration("USERS_INBOX_RETENTION", 7*24*time.Hour, time.Minute, 10*365*24*time.Hour),
		PurgeInterval:  e.Duration("USERS_INBOX_PURGE_INTERVAL", 10*time.Minute, time.Second, 24*time.Hour),
		KeyWait:        e.Duration("USERS_IDEMPOTENCY_WAIT", 5*time.Second, 10*time.Millisecond, 20*time.Second),
	}
	return c, e, e.Err()
}
