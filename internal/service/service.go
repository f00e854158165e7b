// Package service owns the life of each of the project's three processes,
// so that Student, Users and the outbox sender start, run and stop the same
// way: the subcommands ("migrate", "healthcheck"), the logger, the database
// pool, the parts that run side by side (HTTP servers, loops), and a
// graceful stop when the context ends.
package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/telemetry"
)

// Binary describes one binary.
type Binary struct {
	Name        string         // "student", "users" or "outbox-sender": the service attribute of every log line
	Migrations  migrations.Set // "" when the binary has no "migrate" subcommand
	DatabaseURL string         // the binary's own login, as its runtime role
	MaxConns    int32          // the pool's size; 0 for pgx's default
	// MigrateDatabaseURL is the administrator's login, which only
	// "migrate" uses: it creates the roles and has the owner apply the
	// migrations (see migrations.Migrate).
	MigrateDatabaseURL string
	// Logins are the runtime roles of the binary's database, each with the
	// password "migrate" gives it.
	Logins []Login
	// DatabaseTimeout is the server's statement_timeout on every connection
	// the binary serves with (see internal/database); "migrate" runs without
	// one, since a migration may legitimately take minutes.
	DatabaseTimeout time.Duration
	LogLevel        string
	// HealthAddr is the listen address whose /readyz the "healthcheck"
	// subcommand asks. The container image has no shell and no curl, so
	// the binary checks itself.
	HealthAddr string
	// AdminMaxConns, when positive, gives the admin listener's database
	// work (an operator's routes, the scrapes' reads, readiness) a pool of
	// its own of this size, so that it can never take the connections the
	// binary's own work needs. Without it, Pools.Admin is Pools.Main.
	AdminMaxConns int32
	// Start builds the parts that run until the context ends.
	Start func(log *slog.Logger, pools Pools) []Part
	// Commands are the binary's own subcommands, by name: each runs once on
	// the database, with the arguments after its name, and returns.
	Commands map[string]Command
}

// Login is a runtime role's password for "migrate", and the variable it
// was read from, which an error names when it is missing.
type Login struct {
	Role     string // such as migrations.StudentApp
	Variable string // such as "STUDENT_DATABASE_PASSWORD"; its _FILE form counts too
	Password string
}

// Command is a subcommand: it gets the pool and its own arguments.
type Command func(ctx context.Context, pool *pgxpool.Pool, args []string, stdout io.Writer) error

// Pools are the binary's connection pools to its database.
type Pools struct {
	Main  *pgxpool.Pool // the binary's own work
	Admin *pgxpool.Pool // the admin listener's (Binary.AdminMaxConns)
}

// Part is one thing a process runs until its context ends. Run must return
// soon after ctx ends; a part that returns earlier stops the process.
type Part struct {
	Name string // for errors, such as "STUDENT_HTTP_ADDR=:8080"
	Run  func(ctx context.Context) error
}

// Server is the Part that serves h on addr, read from the variable addrVar,
// with at most maxConns connections open at once. name says which of the
// binary's listeners it is ("api", "admin"), in its log lines.
func Server(log *slog.Logger, name, addrVar, addr string, maxConns int, h http.Handler) Part {
	log = log.With(slog.String("listener", name), slog.String("addr_var", addrVar))
	return Part{
		Name: addrVar + "=" + addr,
		Run:  func(ctx context.Context) error { return httpapi.ListenAndServe(ctx, log, addr, maxConns, h) },
	}
}

// Run carries out args: none to serve, "migrate" to apply the migrations
// and return, "healthcheck" to ask the running process whether it is ready.
func (b Binary) Run(ctx context.Context, args []string, stdout io.Writer) error {
	commands := []string{"healthcheck"}
	if b.Migrations != "" {
		commands = append(commands, "migrate")
	}
	command, ok := b.Commands[firstOf(args)]
	for name := range b.Commands {
		commands = append(commands, name)
	}
	slices.Sort(commands)
	switch {
	case len(args) == 0, ok:
	case len(args) == 1 && slices.Contains(commands, args[0]):
	default:
		return fmt.Errorf("unknown arguments %q: want none, or one of %s", args, strings.Join(commands, ", "))
	}
	if len(args) == 1 && args[0] == "healthcheck" {
		return healthcheck(ctx, b.HealthAddr, stdout)
	}

	log, err := NewLogger(stdout, b.LogLevel)
	if err != nil {
		return err
	}
	log = log.With(slog.String("service", b.Name))
	if !ok && len(args) == 1 && args[0] == "migrate" {
		return b.migrate(ctx, log)
	}
	limits := database.Limits{MaxConns: b.MaxConns, StatementTimeout: b.DatabaseTimeout}
	pool, err := database.Open(ctx, b.DatabaseURL, limits) // its errors never echo the URL, which may hold a password
	if err != nil {
		return err
	}
	defer pool.Close()

	if ok {
		return command(ctx, pool, args[1:], stdout)
	}
	pools := Pools{Main: pool, Admin: pool}
	if b.AdminMaxConns > 0 {
		admin, err := database.Open(ctx, b.DatabaseURL, database.Limits{MaxConns: b.AdminMaxConns, StatementTimeout: b.DatabaseTimeout})
		if err != nil {
			return err
		}
		defer admin.Close()
		pools.Admin = admin
	}
	// Tracing (off unless OTEL_EXPORTER_OTLP_* asks for it) serves the
	// running process only; subcommands are not traced.
	// From the process's environment, not Run's getenv: the OpenTelemetry
	// SDK reads the rest of its OTEL_* variables (endpoint, headers,
	// sampler) from there itself, and the switch must agree with them.
	shutdownTracing, err := telemetry.Setup(ctx, log, b.Name, os.Getenv)
	if err != nil {
		return err
	}
	defer func() {
		// The parts have stopped: flush the spans they left queued, but
		// not for long, since a missing collector must not hold the stop.
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(flushCtx); err != nil {
			log.Warn("tracing: spans lost at shutdown", slog.String("error", err.Error()))
		}
	}()
	return RunParts(ctx, b.Start(log, pools))
}

// migrate logs in as the administrator and applies the migrations. It
// needs every runtime role's password: a role left without one could not
// log in, and the failure would only show when its process starts.
func (b Binary) migrate(ctx context.Context, log *slog.Logger) error {
	var missing []string
	passwords := map[string]string{}
	for _, l := range b.Logins {
		if l.Password == "" && !migrations.Optional(l.Role) {
			missing = append(missing, fmt.Sprintf("%s (or %s_FILE)", l.Variable, l.Variable))
		}
		passwords[l.Role] = l.Password
	}
	if len(missing) > 0 {
		return fmt.Errorf("migrate: %s required: migrate sets the password each runtime role logs in with",
			strings.Join(missing, ", "))
	}
	// No statement_timeout: a migration may take minutes. The other limits
	// apply.
	cfg, err := database.Config(b.MigrateDatabaseURL, database.Limits{}) // its errors never echo the URL
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := migrations.Migrate(ctx, cfg.ConnConfig, b.Migrations, passwords); err != nil {
		return err
	}
	log.Info("migrations applied")
	return nil
}

func firstOf(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

// RunParts runs every part until ctx ends or one of them returns, then
// stops the others and waits for them. A part that returns before ctx ends,
// even without an error, is a failure: the process would otherwise go on
// without it.
func RunParts(ctx context.Context, parts []Part) error {
	partsCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, p := range parts {
		wg.Go(func() {
			defer cancel() // one part stopping stops the process
			err := p.Run(partsCtx)
			if err == nil && partsCtx.Err() == nil {
				err = errors.New("stopped on its own")
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// NewLogger returns a JSON logger; level is debug, info, warn or error.
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l, ReplaceAttr: durationText})), nil
}

// durationText writes every duration as Go writes one ("1.5s", "72h0m0s"),
// as the start-up lines and the configuration do: slog's JSON handler
// would write a number of nanoseconds, which a person reading the log
// must divide out, and which reads as seconds to anyone who does not.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// Healthcheck is the "healthcheck" subcommand, for a binary that does not
// run as a Binary (the reconciler, which reads two databases).
func Healthcheck(ctx context.Context, addr string, stdout io.Writer) error {
	return healthcheck(ctx, addr, stdout)
}

// healthcheck asks the process listening on addr (on this host) for
// /readyz and succeeds on 200.
func healthcheck(ctx context.Context, addr string, stdout io.Writer) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("healthcheck: listen address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(host, port) + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", url, resp.Status)
	}
	_, err = fmt.Fprintln(stdout, "ready")
	return err
}

// DefaultProcs is how many cores each service runs Go code on at once
// unless GOMAXPROCS says otherwise: one. The services wait on sockets far
// more than they compute, and with a core of its own idle beside the busy
// one, Go's scheduler wakes a second thread to look for work at nearly
// every hand-off between goroutines, and finds none. make bench measured
// one against the default of one per core (two here): the three services'
// sleeps per student at 200/s fell by a third to a half, the whole
// system's CPU per student by a tenth, and the peak intake and burndown
// by 4-6% (docs/performance.md).
const DefaultProcs = 1

// SetProcs gives the process DefaultProcs, unless GOMAXPROCS is set: the
// Go runtime has applied that already, or ignored a value it cannot use,
// which the binary's configuration then refuses (CheckProcs). main calls
// it, not Run, since it is the whole process's setting, and tests that
// call Run in their own process keep theirs.
func SetProcs(getenv func(string) string) {
	if getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(DefaultProcs)
	}
}

// CheckProcs adds to e's errors a GOMAXPROCS the Go runtime would ignore
// (not a whole number above zero), running on every core instead: it is
// a mistake in the binary's configuration, reported with the others.
// GOMAXPROCS is Go's variable, not the binary's, so it is not among e's
// variables.
func CheckProcs(e *envconfig.Reader, getenv func(string) string) {
	v := getenv("GOMAXPROCS")
	n, err := strconv.Atoi(v)
	e.Check(v == "" || err == nil && n >= 1, "GOMAXPROCS=%q: want a whole number of cores, 1 or more", v)
}
