package faultlab

import (
	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/envconfig"
)

// Config is the lab's configuration; docs/configuration.md lists each
// variable. The defaults are the ports of a system run on one machine as in
// docs/running-without-docker.md.
type Config struct {
	HTTPAddr  string // LAB_HTTP_ADDR: the page, its API, /healthz and /readyz
	ProxyAddr string // LAB_PROXY_ADDR: the fault proxy, the sender's SENDER_USERS_URL
	UsersURL  string // LAB_USERS_URL: Users, where the proxy forwards to

	StudentURL string // LAB_STUDENT_URL: Student's API, to create students
	// StudentToken is the lab's bearer token on Student's API, one of its
	// STUDENT_API_TOKENS: the page creates students with it.
	StudentToken    auth.Secret // LAB_STUDENT_TOKEN or LAB_STUDENT_TOKEN_FILE
	StudentAdminURL string      // LAB_STUDENT_ADMIN_URL: Student's /readyz
	UsersAdminURL   string      // LAB_USERS_ADMIN_URL: Users' /readyz
	SenderAdminURL  string      // LAB_SENDER_ADMIN_URL: the sender's /readyz and dead-letter API
	SenderCaller    string      // LAB_SENDER_CALLER: the sender's caller name in Users' USERS_API_TOKENS
	// SenderAdminToken is the lab's operator token for the sender's outbox
	// routes, listed in the sender's SENDER_ADMIN_TOKENS: the page's
	// redrive button uses it. Without it, redrives are refused (401).
	SenderAdminToken auth.Secret // LAB_SENDER_ADMIN_TOKEN or LAB_SENDER_ADMIN_TOKEN_FILE

	// AllowedHosts are the host names the page answers to, beside the
	// loopback ones (LAB_ALLOWED_HOSTS, comma-separated): a Host header
	// check, so that another site cannot reach the controls by pointing a
	// name of its own at 127.0.0.1 (DNS rebinding).
	AllowedHosts []string

	// Both logins are the read-only lab_reader.
	StudentDatabaseURL string // LAB_STUDENT_DATABASE_URL (+ LAB_STUDENT_DATABASE_PASSWORD)
	UsersDatabaseURL   string // LAB_USERS_DATABASE_URL (+ LAB_USERS_DATABASE_PASSWORD)

	LogLevel string // LOG_LEVEL
}

// LoadConfig reads Config through getenv. Both listeners default to
// loopback: the page's controls have no login, and the proxy counts
// whatever passes as a delivery. Compose, where the sender and the browser
// come from outside the container, sets them to all interfaces. The Reader
// it returns lists the variables read, for the test that checks
// docker-compose.yml.
func LoadConfig(getenv func(string) string) (Config, *envconfig.Reader, error) {
	e := envconfig.New(getenv)
	studentDB, _ := e.DatabaseLogin("LAB_STUDENT_DATABASE_URL",
		"postgres://"+migrations.LabReader+"@localhost:5432/student?sslmode=disable", "LAB_STUDENT_DATABASE_PASSWORD")
	usersDB, _ := e.DatabaseLogin("LAB_USERS_DATABASE_URL",
		"postgres://"+migrations.LabReader+"@localhost:5432/users?sslmode=disable", "LAB_USERS_DATABASE_PASSWORD")
	c := Config{
		HTTPAddr:  e.String("LAB_HTTP_ADDR", "127.0.0.1:8084"),
		ProxyAddr: e.String("LAB_PROXY_ADDR", "127.0.0.1:8083"),
		UsersURL:  e.URL("LAB_USERS_URL", "http://localhost:8081", "http", "https"),

		StudentURL:      e.URL("LAB_STUDENT_URL", "http://localhost:8080", "http", "https"),
		StudentAdminURL: e.URL("LAB_STUDENT_ADMIN_URL", "http://localhost:8090", "http", "https"),
		UsersAdminURL:   e.URL("LAB_USERS_ADMIN_URL", "http://localhost:8091", "http", "https"),
		SenderAdminURL:  e.URL("LAB_SENDER_ADMIN_URL", "http://localhost:8082", "http", "https"),
		SenderCaller:    e.String("LAB_SENDER_CALLER", "outbox-sender"),
		AllowedHosts:    e.Hosts("LAB_ALLOWED_HOSTS"),

		StudentDatabaseURL: studentDB,
		UsersDatabaseURL:   usersDB,
		LogLevel:           e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
	}
	c.StudentToken = auth.TokenVar(e, "LAB_STUDENT_TOKEN")
	c.SenderAdminToken = auth.TokenVar(e, "LAB_SENDER_ADMIN_TOKEN")
	return c, e, e.Err()
}
