package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The three binaries, by the name `go build` gives them.
const (
	studentBin = "student"
	usersBin   = "users"
	senderBin  = "outbox-sender"
)

// buildBinaries builds the three binaries into dir, plainly (no tags), as
// `make build` does.
func buildBinaries(ctx context.Context, root, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"./services/student", "./services/users", "./outbox-sender")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build binaries: %w\n%s", err, out)
	}
	return nil
}

// buildBroker builds the broker's process (natsd) into dir, from this
// checkout: the bench starts it when it measures SENDER_TRANSPORT=nats.
func buildBroker(ctx context.Context, root, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, natsdBin), "./testkit/natsserver/natsd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the broker: %w\n%s", err, out)
	}
	return nil
}

// proc is one binary running as a child process, in its own process group,
// with its output in a log file.
type proc struct {
	name string // the binary's name
	// peakKey is what its peak RSS is reported under: the binary's name,
	// or the sender's with its source when that is not the default.
	peakKey string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
}

// startProc starts bin with exactly env (and PATH): nothing from the
// caller's environment leaks in, so a LOG_LEVEL or a tuning variable in the
// developer's shell cannot change what is measured.
func startProc(bin, logPath string, env []string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	// exec.Command, not CommandContext: the bench stops what it started
	// itself, gracefully first (stop), whatever happened to its context.
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &proc{name: filepath.Base(bin), peakKey: filepath.Base(bin), logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// alive is an error naming the log when the process has exited.
func (p *proc) alive() error {
	if p.exited() {
		return fmt.Errorf("%s exited (%s); see %s", p.name, p.cmd.ProcessState, p.logPath)
	}
	return nil
}

// stop asks the process to shut down (SIGTERM), as a deployment would,
// and kills its group if it has not exited within 10s. It always waits.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
}

// waitReady polls url (a /readyz) until it answers 200.
func (p *proc) waitReady(ctx context.Context, url string) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
		if err != nil {
			return fmt.Errorf("ready %s: %w", p.name, err)
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := p.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready at %s after 30s; see %s", p.name, url, p.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// procs tracks every child the bench has running, so that an error or a
// Ctrl-C anywhere still stops them all.
type procs struct {
	mu  sync.Mutex
	set map[*proc]bool
	// peak is the highest VmHWM (kB) seen per binary, over all its runs.
	peak map[string]int64
}

func (ps *procs) add(p *proc) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.set[p] = true
}

// stop reads p's peak RSS, then stops it.
func (ps *procs) stop(p *proc) {
	// A process already reaped has no status to read, and its pid may be
	// another's by now: its peak was read when it was first stopped.
	if hwm, err := procStatusKB(p.pid(), "VmHWM"); err == nil && !p.exited() {
		ps.mu.Lock()
		ps.peak[p.peakKey] = max(ps.peak[p.peakKey], hwm)
		ps.mu.Unlock()
	}
	p.stop()
	ps.mu.Lock()
	delete(ps.set, p)
	ps.mu.Unlock()
}

func (ps *procs) stopAll() {
	ps.mu.Lock()
	all := make([]*proc, 0, len(ps.set))
	for p := range ps.set {
		all = append(all, p)
	}
	ps.mu.Unlock()
	for _, p := range all {
		ps.stop(p)
	}
}

func (ps *procs) peakKB(name string) int64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.peak[name]
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture Go runs on (Go has no sysconf without cgo).
const clockTicks = 100

// cpuTime is the CPU time the process has used, user and system.
func cpuTime(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	t, err := ticks(f, 14, 15) // utime, stime
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	return t, nil
}

// sleeps is how many times the process's threads have gone to sleep
// waiting for something (a socket, a lock, a timer, the disk): the sum of
// voluntary_ctxt_switches over /proc/PID/task/*/status. Each sleep ends in
// a wake-up, which the profiles show to be where the CPU goes, and a count
// does not depend on how fast the shared machine runs that hour, as CPU
// time does. Threads that have exited take their counts with them; the
// services' threads live as long as they do.
func sleeps(pid int) (int64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, fmt.Errorf("sleeps: %w", err)
	}
	var n int64
	for _, t := range tasks {
		c, err := statusValue(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()), "voluntary_ctxt_switches")
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread exited meanwhile
		}
		if err != nil {
			return 0, fmt.Errorf("sleeps: %w", err)
		}
		n += c
	}
	return n, nil
}

// procStatusKB reads a "Vm…: N kB" line of /proc/PID/status.
func procStatusKB(pid int, field string) (int64, error) {
	return statusValue(fmt.Sprintf("/proc/%d/status", pid), field)
}

// statusValue reads the number on a "FIELD: N" line (or "FIELD: N kB") of
// a status file of /proc.
func statusValue(path, field string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", field, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s: %w", path, field, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s: not in %s", field, path)
}

// statFields are the fields of /proc/PID/stat from field 3 (the state) on:
// the command name before them, in parentheses, may hold spaces.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	_, rest, ok := bytes.Cut(b, []byte(") "))
	if !ok {
		return nil, fmt.Errorf("odd /proc/%d/stat", pid)
	}
	f := strings.Fields(string(rest))
	if len(f) < 15 {
		return nil, fmt.Errorf("odd /proc/%d/stat", pid)
	}
	return f, nil
}

// ticks sums fields of stat (numbered as proc(5) numbers them) as CPU time.
func ticks(f []string, fields ...int) (time.Duration, error) {
	var n int64
	for _, field := range fields {
		v, err := strconv.ParseInt(f[field-3], 10, 64)
		if err != nil {
			return 0, err
		}
		n += v
	}
	return time.Duration(n) * time.Second / clockTicks, nil
}

// parentPID is the parent of process pid (field 4 of its stat).
func parentPID(pid int) (int, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, fmt.Errorf("parent of %d: %w", pid, err)
	}
	return strconv.Atoi(f[1])
}

// serverCPU is the CPU time a PostgreSQL server has used: its postmaster's
// own and that of its children that have exited (cutime and cstime: the
// postmaster reaps every backend), plus each running child's (the
// backends, the walsenders, the checkpointer, the WAL writer...), which
// byPID gives one by one with what each is (serverRole).
func serverCPU(postmaster int) (total time.Duration, byPID map[int]serverProc, err error) {
	f, err := statFields(postmaster)
	if err != nil {
		return 0, nil, fmt.Errorf("server cpu: %w", err)
	}
	total, err = ticks(f, 14, 15, 16, 17)
	if err != nil {
		return 0, nil, fmt.Errorf("server cpu: %w", err)
	}
	byPID = map[int]serverProc{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, nil, fmt.Errorf("server cpu: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(pid)
		if err != nil || f[1] != strconv.Itoa(postmaster) {
			continue // gone meanwhile, or not the server's
		}
		if t, err := ticks(f, 14, 15); err == nil {
			total += t
			w, err := sleeps(pid)
			if err != nil {
				w = -1
			}
			byPID[pid] = serverProc{role: serverRole(pid), cpu: t, sleeps: w}
		}
	}
	return total, byPID, nil
}

// backendApps is the application_name of each backend that has one, by
// process id, but the bench's own.
func (b *bench) backendApps(ctx context.Context) (map[int]string, error) {
	apps := map[int]string{}
	err := b.withServer(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `
			SELECT pid, application_name FROM pg_stat_activity
			WHERE application_name <> '' AND usename <> current_user`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var pid int
			var app string
			if err := rows.Scan(&pid, &app); err != nil {
				return err
			}
			apps[pid] = app
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("backends' names: %w", err)
	}
	return apps, nil
}

// named is procs with each backend that apps names labelled "ROLE
// (NAME)", so that the split shows it apart from its role's others.
func named(procs map[int]serverProc, apps map[int]string) map[int]serverProc {
	out := make(map[int]serverProc, len(procs))
	for pid, p := range procs {
		if app, ok := apps[pid]; ok {
			p.role = fmt.Sprintf("%s (%s)", p.role, app)
		}
		out[pid] = p
	}
	return out
}

// serverProc is one of PostgreSQL's running processes: what it is, the
// CPU it has used, and how often it has gone to sleep (sleeps; -1 when it
// could not be read).
type serverProc struct {
	role   string
	cpu    time.Duration
	sleeps int64
}

// exitedRole is what the split of PostgreSQL's CPU calls the rest: the
// postmaster's own, and what processes that exited within the window used
// (autovacuum workers, say), which their exit folds into the postmaster's.
const exitedRole = "postmaster and exited processes"

// serverSplit is the CPU each kind of process used between two readings
// of serverCPU (total and byPID each), by role; what no running process
// accounts for is exitedRole's.
func serverSplit(total time.Duration, before, after map[int]serverProc) map[string]time.Duration {
	split := map[string]time.Duration{}
	rest := total
	for pid, p := range after {
		d := p.cpu - before[pid].cpu // a new process: all of it
		split[p.role] += d
		rest -= d
	}
	if rest > 0 {
		split[exitedRole] += rest
	}
	return split
}

// serverSleeps is how often PostgreSQL's processes went to sleep between
// two readings of serverCPU, in all and by role (as serverSplit). Only
// the postmaster's children running at the second reading count: one that
// exited between them (an autovacuum worker) took its count with it, and
// one whose count could not be read at either reading counts none. The
// postmaster itself, which only starts and reaps them, is not read.
func serverSleeps(before, after map[int]serverProc) (total int64, byRole map[string]int64) {
	byRole = map[string]int64{}
	for pid, p := range after {
		b, existed := before[pid]
		if p.sleeps < 0 || (existed && b.sleeps < 0) {
			continue
		}
		d := p.sleeps
		if existed {
			d -= b.sleeps
		}
		byRole[p.role] += d
		total += d
	}
	return total, byRole
}

// serverRole is what a server process is, by its title (roleOfTitle);
// "?" when it cannot be read.
func serverRole(pid int) string {
	return roleOfTitle(procTitle(pid))
}

// procTitle is a process's command line, which a PostgreSQL process sets
// to its title; "" when it cannot be read.
func procTitle(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.TrimRight(string(b), "\x00")
}

// roleOfTitle is what a PostgreSQL process's title says it is: "postgres:
// ROLE DATABASE HOST(PORT) STATE" (or [local]) for a backend, which is its
// login role (benchAdmin for the bench's own); "postgres: walsender ROLE
// ..." for a walsender; "postgres: walwriter" and the like for the others;
// "?" for a title not PostgreSQL's.
func roleOfTitle(title string) string {
	rest, ok := strings.CutPrefix(title, "postgres: ")
	if !ok {
		return "?"
	}
	f := strings.Fields(rest)
	switch {
	case len(f) >= 2 && f[0] == "walsender":
		return "walsender " + f[1]
	case len(f) >= 3 && (strings.Contains(f[2], "(") || f[2] == "[local]"):
		if f[0] == "postgres" {
			return benchAdmin
		}
		return f[0]
	}
	return strings.Join(f, " ")
}

// benchAdmin names the sessions of the bench's own administrator (the
// cluster's superuser, postgres): seeding, and watching for links.
const benchAdmin = "the bench (postgres)"
