package main

import (
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxref/outboxref/internal/envconfig"
)

// config is what make run reads from the environment.
type config struct {
	// portBase moves every port: Student's API on it, the rest above it
	// (ports).
	portBase int // RUN_PORT_BASE
	// databaseURL, when set, is a PostgreSQL server to use instead of a
	// throwaway one, as a superuser (it creates roles and databases).
	databaseURL string // RUN_DATABASE_URL
	// dataDir, when set, keeps the throwaway cluster there between runs.
	dataDir string // RUN_DATA_DIR
	source  string // SENDER_SOURCE, passed to the sender
	// transport is SENDER_TRANSPORT, passed to the sender; with "nats"
	// make run also starts a NATS server, and Users reads its commands.
	transport string
	logLevel  string // LOG_LEVEL, passed to every binary
}

// The ports, as offsets from RUN_PORT_BASE. The first five are the ones
// docker-compose.yml publishes, in the same order; the rest come above them.
const (
	portStudent      = 0 // Student's API
	portUsers        = 1 // Users' API
	portSenderAdmin  = 2 // the sender's admin port
	portLabProxy     = 3 // the lab's fault proxy, which the sender calls
	portLabPage      = 4 // the lab's page
	portStudentAdmin = 5
	portUsersAdmin   = 6
	portPostgres     = 7 // the throwaway cluster
	portNATS         = 8 // the NATS server, with SENDER_TRANSPORT=nats
	portCount        = 9
)

// portNames says what listens at each offset, for the message when a port
// is taken; docs/running-without-docker.md's table names them the same
// (config_test.go).
var portNames = [portCount]string{
	"Student's API", "Users' API", "the sender's admin port", "the fault lab's proxy", "the fault lab's page",
	"Student's admin port", "Users' admin port", "PostgreSQL", "NATS",
}

func loadConfig(getenv func(string) string) (config, error) {
	e := envconfig.New(getenv)
	c := config{
		portBase:    e.Int("RUN_PORT_BASE", 8080, 1024, 65535-portCount),
		databaseURL: e.String("RUN_DATABASE_URL", ""),
		dataDir:     e.String("RUN_DATA_DIR", ""),
		source:      e.OneOf("SENDER_SOURCE", "poll", "poll", "cdc"),
		transport:   e.OneOf("SENDER_TRANSPORT", "http", "http", "nats"),
		logLevel:    e.OneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
	}
	_, err := pgconn.ParseConfig(c.databaseURL)
	e.Check(c.databaseURL == "" || err == nil,
		"RUN_DATABASE_URL: not a PostgreSQL connection URL (the value is not shown: it may hold a password)")
	e.Check(c.databaseURL == "" || c.dataDir == "",
		"RUN_DATA_DIR keeps a throwaway cluster's data; with RUN_DATABASE_URL the data is that server's: set one of the two")
	return c, e.Err()
}

// port is the port at offset from the base.
func (c config) port(offset int) int { return c.portBase + offset }

// addr is the loopback address of the port at offset: make run is for
// this machine, so nothing listens on other interfaces.
func (c config) addr(offset int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port(offset)))
}

// url is how a person or another process reaches the port at offset.
func (c config) url(offset int) string {
	return "http://localhost:" + strconv.Itoa(c.port(offset))
}

// checkPorts fails, naming the port and what it is for, when one is taken:
// better at once than a process that cannot listen halfway through.
func (c config) checkPorts(throwaway bool) error {
	for offset, name := range portNames {
		if offset == portPostgres && !throwaway || offset == portNATS && c.transport != "nats" {
			continue
		}
		ln, err := net.Listen("tcp", c.addr(offset))
		if err != nil {
			return fmt.Errorf("port %d (%s, RUN_PORT_BASE+%d) is taken: set RUN_PORT_BASE to move every port, as in make run RUN_PORT_BASE=%d: %w",
				c.port(offset), name, offset, c.portBase+1000, err)
		}
		_ = ln.Close()
	}
	return nil
}
