// Package pgcluster owns throwaway PostgreSQL clusters for tests and the
// end-to-end suite: it initialises a private data directory, runs a
// postmaster on a loopback port with durability switched off for speed, and
// removes every trace of it again. Nothing here touches a server it did not
// start.
//
// Every role logs in with its password (SCRAM-SHA-256), over TCP and over
// the Unix socket alike, from the moment initdb writes the cluster: a
// trusted local login would let any account on the machine act as the
// superuser, and run shell commands as the server's user with
// COPY ... TO PROGRAM. The administrator, postgres, gets a random password,
// kept in the cluster's directory (PasswordFile) and carried in URL.
package pgcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/testkit/freeport"
)

// serverBinaries are the programs a cluster needs; a directory only counts
// if it has all of them, because pg_ctl finds postgres next to itself.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// FindBinDir returns the directory holding initdb, pg_ctl and postgres. PATH
// wins so a developer can point at a build of their choice; otherwise the
// newest Debian/Ubuntu install is used, since those packages keep the server
// binaries off PATH.
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// Resolve symlinks first: PATH often holds a farm of links (as
		// /usr/local/bin does here), and the real directory is the one
		// that certainly has the matching pg_ctl and postgres.
		candidates := []string{}
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(resolved))
		}
		candidates = append(candidates, filepath.Dir(p))
		for _, dir := range candidates {
			if abs, err := filepath.Abs(dir); err == nil && hasServerBinaries(abs) {
				return abs, nil
			}
		}
	}

	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	type versioned struct {
		dir     string
		version []int
	}
	var found []versioned
	for _, m := range matches {
		v, ok := parseVersion(filepath.Base(filepath.Dir(m)))
		if ok && hasServerBinaries(m) {
			found = append(found, versioned{m, v})
		}
	}
	if len(found) > 0 {
		// A plain string sort would put 9.6 above 15.
		slices.SortFunc(found, func(a, b versioned) int { return slices.Compare(b.version, a.version) })
		return found[0].dir, nil
	}
	return "", errors.New("no PostgreSQL server binaries found (looked for initdb on PATH and in /usr/lib/postgresql/*/bin): " +
		"install them (Debian/Ubuntu: apt-get install postgresql-15) or set TEST_DATABASE_URL to a server you own")
}

func hasServerBinaries(dir string) bool {
	for _, name := range serverBinaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// parseVersion turns "15" or "9.6" into comparable numbers and rejects
// anything else that happens to live under /usr/lib/postgresql.
func parseVersion(s string) ([]int, bool) {
	var v []int
	for part := range strings.SplitSeq(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		v = append(v, n)
	}
	return v, true
}

// Options configures Start. The zero value is ready to use.
type Options struct {
	// Dir is where the cluster's own directory is created. Empty means
	// the system temporary directory. Start always makes a fresh
	// subdirectory so that Cleanup only ever removes what it created.
	Dir string
	// Port is the TCP port on 127.0.0.1. Zero picks a free one.
	Port int
	// Log, if set, receives the output of initdb and pg_ctl. The server's
	// own log always goes to LogPath.
	Log io.Writer
	// BinDir overrides FindBinDir, so a caller that already found the
	// binaries starts exactly those.
	BinDir string
	// Durable runs the server as a deployment would: fsync, full-page
	// writes and synchronous commits on. Tests leave it off for speed;
	// a benchmark must not, or every commit would cost less than it does.
	Durable bool
	// Home, when set, is a directory the cluster is kept in between runs
	// instead of Dir's throwaway subdirectory: Start creates the cluster
	// there the first time (initdb) and starts the one it finds after;
	// Cleanup stops it and leaves its files. Missing parents are made as
	// mkdir -p makes them (0755), so that the server's user can reach it.
	Home string
}

// passwordFile is the name, in the cluster's directory, of the file that
// holds the administrator's password.
const passwordFile = "postgres.password"

// Cluster is one running (or stopped) throwaway server. Its methods are safe
// for concurrent use.
type Cluster struct {
	binDir  string
	dir     string // the directory Start created; everything lives below it
	dataDir string
	logPath string
	port    int
	log     io.Writer
	durable bool
	kept    bool // Options.Home: Cleanup leaves the files
	// made is the topmost directory Start created, "" if it created none
	// (a Home that existed): a failed Start removes it.
	made string
	// fresh: Start ran initdb, so a failed Start removes what it wrote in
	// a Home that existed before.
	fresh    bool
	password string // the administrator's
	env      []string
	cred     *syscall.Credential // nil unless we must drop root

	mu      sync.Mutex
	running bool
	removed bool
}

// URL is a connection string for the cluster's postgres database, as the
// administrator, password included.
func (c *Cluster) URL() string { return c.databaseURL("postgres") }

// Password is the administrator's (postgres's) password.
func (c *Cluster) Password() string { return c.password }

// PasswordFile is the file that keeps the administrator's password, mode
// 0600: in a Home it outlives the run, and the next Start reads it there.
func (c *Cluster) PasswordFile() string { return filepath.Join(c.dir, passwordFile) }

// Port is the TCP port the server listens on at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// DataDir is the cluster's PGDATA.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogPath is the server log, worth reading when a test sees odd behaviour.
func (c *Cluster) LogPath() string { return c.logPath }

func (c *Cluster) databaseURL(name string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword("postgres", c.password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + name,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Start creates and starts a new cluster. On failure nothing is left behind:
// no directory and no server process (a Home that held a cluster keeps it).
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		var err error
		if cred, err = unprivilegedCredential(); err != nil {
			return nil, err
		}
	}

	var dir, made string
	var err error
	if opts.Home != "" {
		if dir, err = filepath.Abs(opts.Home); err == nil {
			made, err = makeHome(dir)
		}
	} else {
		dir, err = os.MkdirTemp(opts.Dir, "pgcluster-")
		made = dir
	}
	if err != nil {
		if made != "" {
			_ = os.RemoveAll(made)
		}
		return nil, fmt.Errorf("create cluster dir: %w", err)
	}
	c := &Cluster{
		kept:    opts.Home != "",
		made:    made,
		binDir:  binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
		port:    opts.Port,
		log:     opts.Log,
		durable: opts.Durable,
		cred:    cred,
	}
	if err := c.setup(ctx); err != nil {
		c.abandon()
		return nil, err
	}
	return c, nil
}

// makeHome makes dir and its missing parents and returns the topmost one
// it made ("" if dir existed). The parents get 0755, whatever the umask:
// when we are root the server runs as another user, who must pass through
// them to reach dir.
func makeHome(dir string) (string, error) {
	made := ""
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		made = d
		if d == filepath.Dir(d) {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return made, err
	}
	for d := filepath.Dir(dir); made != "" && len(d) >= len(made); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			return made, err
		}
	}
	return made, nil
}

func (c *Cluster) setup(ctx context.Context) error {
	// The directory holds the data, the server's Unix socket and the
	// administrator's password: nobody but the server's user (and root)
	// may enter it.
	if err := os.Chmod(c.dir, 0o700); err != nil {
		return fmt.Errorf("chmod cluster dir: %w", err)
	}
	_, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION"))
	c.fresh = !c.kept || err != nil
	if err := c.loadPassword(); err != nil {
		return err
	}
	if c.cred != nil {
		// The password file too: initdb reads it as the server's user.
		if err := chownTree(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("chown cluster dir: %w", err)
		}
	}
	c.env = childEnv(c.binDir, c.dir)

	// Passwords are required from the first start: setting them after it
	// would leave a window in which the cluster trusts everyone.
	if c.fresh {
		out, err := c.run(ctx, "initdb", "-D", c.dataDir, "-U", "postgres", "--pwfile="+c.PasswordFile(),
			"--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "--encoding=UTF8", "--no-sync")
		if err != nil {
			err = fmt.Errorf("initdb: %w%s", err, indent(out))
			if hint := c.accessHint(); hint != "" {
				err = fmt.Errorf("%w\n%s", err, hint)
			}
			return err
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.port != 0 {
		return c.startLocked(ctx)
	}
	// The free port we pick can be taken by someone else before the
	// postmaster binds it, which parallel tests make likely enough to be
	// worth a couple of retries.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.port = port
		err = c.startLocked(ctx)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "could not bind") {
			return err
		}
	}
}

// loadPassword makes up the administrator's password for a fresh cluster
// and writes it to PasswordFile, or reads it there for a kept one.
func (c *Cluster) loadPassword() error {
	path := c.PasswordFile()
	if !c.fresh {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s holds a cluster without %s, made before its administrator had a password: remove the directory to start afresh", c.dir, passwordFile)
		}
		if err != nil {
			return fmt.Errorf("read the administrator's password: %w", err)
		}
		c.password = strings.TrimSpace(string(b))
		return nil
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	c.password = hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(c.password+"\n"), 0o600); err != nil {
		return fmt.Errorf("write the administrator's password: %w", err)
	}
	return nil
}

// unprivilegedCredential picks who runs the server when we are root: initdb
// and postgres refuse to run as root, because a compromised server would own
// the machine.
func unprivilegedCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("running as root and found neither a postgres nor a nobody user to run the server as: %w", err)
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: bad uid %q", u.Username, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: bad gid %q", u.Username, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// childEnv is deliberately minimal: inherited PG* variables (PGPORT, PGDATA,
// PGHOST...) would silently steer pg_ctl towards some other server, and the
// unprivileged user cannot use root's HOME.
func childEnv(binDir, home string) []string {
	lang := "C"
	// C.UTF-8 gives sensible character classification for UTF8 data, but
	// initdb fails outright on a locale the system lacks, so fall back to C.
	if _, err := os.Stat("/usr/lib/locale/C.utf8"); err == nil {
		lang = "C.UTF-8"
	}
	return []string{
		"PATH=" + binDir + ":/usr/local/bin:/usr/bin:/bin",
		"LANG=" + lang,
		"LC_ALL=" + lang,
		"HOME=" + home,
	}
}

// accessHint explains the commonest initdb failure when running as root: a
// Dir under a private directory such as /root, which the server's user
// cannot enter. It only looks at plain permission bits, so it is a hint and
// not a verdict.
func (c *Cluster) accessHint() string {
	if c.cred == nil {
		return ""
	}
	for d := filepath.Dir(c.dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			st, ok := fi.Sys().(*syscall.Stat_t)
			if ok {
				perm := fi.Mode().Perm()
				var canEnter bool
				switch {
				case st.Uid == c.cred.Uid:
					canEnter = perm&0o100 != 0
				case st.Gid == c.cred.Gid:
					canEnter = perm&0o010 != 0
				default:
					canEnter = perm&0o001 != 0
				}
				if !canEnter {
					return fmt.Sprintf("hint: uid %d, which runs the server because we are root, probably cannot enter %s; use a Dir it can reach, such as one under /tmp", c.cred.Uid, d)
				}
			}
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

func freePort() (int, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return 0, err
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// run runs one of the server binaries as the cluster's user and returns its
// combined output, which is also copied to Options.Log.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	w := io.Writer(&out)
	if c.log != nil {
		w = io.MultiWriter(&out, c.log)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Env = c.env
	// The caller's working directory may be one the server's user cannot
	// enter, and initdb and pg_ctl both want a usable one.
	cmd.Dir = c.dir
	cmd.Stdout = w
	cmd.Stderr = w
	// The postmaster that pg_ctl leaves behind should not hold our pipes
	// (pg_ctl redirects it to the log), but never hang on it if it does.
	cmd.WaitDelay = 5 * time.Second
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	err := cmd.Run()
	return out.Bytes(), err
}

// startLocked runs pg_ctl start and waits until the server accepts
// connections. Callers hold c.mu.
func (c *Cluster) startLocked(ctx context.Context) error {
	// pg_ctl hands -o to /bin/sh, so the socket directory must be quoted.
	serverOpts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=300 -c shared_buffers=128MB"+
		// Logical decoding, for the sender's change-data-capture source.
		" -c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=64",
		c.port, shellQuote(c.dir))
	if !c.durable {
		serverOpts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-l", c.logPath, "-w", "-t", "60", "-o", serverOpts, "start")
	if err != nil {
		err = fmt.Errorf("pg_ctl start on port %d: %w%s%s", c.port, err, indent(out), c.logTail())
		// A timeout or a cancelled context can leave a postmaster
		// running that we would otherwise never hear of again.
		c.forceStopLocked()
		return err
	}
	c.running = true
	return nil
}

// Stop shuts the server down, ending client sessions (fast mode). Stopping a
// stopped cluster does nothing.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopLocked(ctx)
}

func (c *Cluster) stopLocked(ctx context.Context) error {
	if !c.running {
		return nil
	}
	out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", "fast", "-w", "-t", "60", "stop")
	if err != nil {
		if pid, perr := c.postmasterPID(); perr == nil && alive(pid) {
			return fmt.Errorf("pg_ctl stop: %w%s%s", err, indent(out), c.logTail())
		}
		// The server died some other way (a crash, or Kill racing us);
		// what matters to the caller is that it is not running.
	}
	c.running = false
	return nil
}

// Restart stops the server and starts it again on the same port with the same
// settings, which is how tests simulate a database restart. It also brings a
// cluster back after Kill, going through crash recovery.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return errors.New("restart: cluster already cleaned up")
	}
	if err := c.stopLocked(ctx); err != nil {
		return err
	}
	return c.startLocked(ctx)
}

// Kill sends SIGKILL to the postmaster, the closest thing to pulling the
// plug, and waits until it and its child processes are gone so that a
// following Restart does not find their shared memory still attached.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	pid, err := c.postmasterPID()
	if err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	if !alive(pid) {
		c.running = false
		return fmt.Errorf("kill: postmaster %d is not running", pid)
	}
	err = c.killLocked(pid)
	c.running = false
	return err
}

func (c *Cluster) killLocked(pid int) error {
	// Note the children before the kill: once the postmaster is gone they
	// are reparented and we could no longer tell them from anyone else's.
	procs := append(childrenOf(pid), pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill postmaster %d: %w", pid, err)
	}
	// Children notice the postmaster's death and exit on their own within
	// milliseconds; one stuck in a system call gets SIGKILL too.
	if !waitGone(procs, 10*time.Second) {
		for _, p := range procs {
			if alive(p) {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if !waitGone(procs, 10*time.Second) {
			return fmt.Errorf("kill: server processes of postmaster %d still running", pid)
		}
	}
	c.removeLockFiles(pid)
	return nil
}

// removeLockFiles deletes the lock files a killed postmaster leaves behind.
// The next postmaster would normally see that their PID is dead and take
// over, but where init does not reap orphans the dead postmaster lingers as
// a zombie, which still counts as alive to kill(pid, 0), and the restart
// would refuse with "lock file already exists". Only call this once the
// processes are known to be gone.
func (c *Cluster) removeLockFiles(pid int) {
	for _, f := range []string{
		filepath.Join(c.dataDir, "postmaster.pid"),
		filepath.Join(c.dir, fmt.Sprintf(".s.PGSQL.%d.lock", c.port)),
	} {
		if got, err := lockFilePID(f); err == nil && got == pid {
			_ = os.Remove(f)
		}
	}
}

// forceStopLocked is the last resort used on error paths: it must not leave
// a server running, whatever state things are in.
func (c *Cluster) forceStopLocked() {
	pid, err := c.postmasterPID()
	if err != nil || !alive(pid) {
		c.running = false
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", "immediate", "-w", "-t", "20", "stop")
	if alive(pid) {
		_ = c.killLocked(pid)
	}
	c.running = false
}

// Cleanup stops the server if it runs and removes the directory Start made.
// It is safe to call more than once, so it can sit in both a defer and a
// t.Cleanup.
func (c *Cluster) Cleanup(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil
	}
	var errs []error
	if err := c.stopLocked(ctx); err != nil {
		errs = append(errs, err)
	}
	// Whether or not the polite stop worked, removing the data directory
	// under a live postmaster would leave an orphan, so make sure.
	c.forceStopLocked()
	if c.kept {
		c.removed = true
		return errors.Join(errs...)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", c.dir, err))
	}
	c.removed = true
	return errors.Join(errs...)
}

// abandon undoes a failed Start: it removes the directories Start made,
// or, in a Home that existed, the cluster it had just initialised there.
func (c *Cluster) abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forceStopLocked()
	switch {
	case c.made != "":
		_ = os.RemoveAll(c.made)
	case c.fresh:
		_ = os.RemoveAll(c.dataDir)
		_ = os.Remove(c.logPath)
		_ = os.Remove(c.PasswordFile())
	}
	c.removed = true
}

// CreateDatabase creates an empty database with durable commits and returns
// its URL, for processes that migrate it themselves. The cluster runs with
// synchronous_commit=off for speed, which lets a killed server forget
// commits it already acknowledged; the database's own setting overrides the
// server's, so a test that kills the server still judges "nothing committed
// may be lost" honestly. (With fsync=off a killed postmaster still loses
// nothing the kernel has: tests kill processes, not the machine.)
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return "", fmt.Errorf("create database %q: connect: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", fmt.Errorf("create database %q: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident+" SET synchronous_commit = on"); err != nil {
		return "", fmt.Errorf("create database %q: durable commits: %w", name, err)
	}
	return c.databaseURL(name), nil
}

func (c *Cluster) postmasterPID() (int, error) {
	return lockFilePID(filepath.Join(c.dataDir, "postmaster.pid"))
}

// lockFilePID reads the PID on the first line of a PostgreSQL lock file.
func lockFilePID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read lock file: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s: bad pid %q", filepath.Base(path), first)
	}
	return pid, nil
}

// alive reports whether pid is a running process. A zombie counts as gone:
// pg_ctl daemonises the postmaster, so its parent is init, and an init that
// does not reap (as in some containers) leaves it a zombie forever.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false
		}
		// No usable /proc: fall back to asking the kernel.
		return syscall.Kill(pid, 0) == nil
	}
	state, _, ok := procStat(b)
	return ok && state != "Z" && state != "X"
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(b); ok && ppid == pid {
			kids = append(kids, p)
		}
	}
	return kids
}

// procStat parses state and parent pid out of /proc/PID/stat. The command
// name is in parentheses and may itself contain spaces and parentheses,
// hence the search for the last one.
func procStat(b []byte) (state string, ppid int, ok bool) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return "", 0, false
	}
	return f[0], ppid, true
}

func waitGone(pids []int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		gone := !slices.ContainsFunc(pids, alive)
		if gone {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logTail returns the end of the server log, formatted for an error message:
// pg_ctl itself only says that the server failed, the log says why.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "\nserver log " + c.logPath + " ends with:" + indent([]byte(strings.Join(lines, "\n")))
}

// indent formats command output for inclusion in an error message.
func indent(out []byte) string {
	s := strings.TrimRight(string(out), "\n")
	if strings.TrimSpace(s) == "" {
		return ""
	}
	return "\n\t" + strings.ReplaceAll(s, "\n", "\n\t")
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
