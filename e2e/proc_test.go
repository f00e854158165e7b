//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one service binary run as an OS process. It can be started,
// killed and started again with the same environment, which is how the
// scenarios crash and restart services. Output goes to one log file per
// process, appended across restarts with a marker line per start.
type proc struct {
	name    string
	bin     string
	args    []string // the binary's arguments, none for a service
	env     []string // the service's variables; PATH is added
	logPath string
	ready   string // URL that answers 200 once the process is ready

	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{} // closed when the current run has exited
	state       *os.ProcessState
	starts      int
	wantRunning bool     // false while an exit is expected (a kill or a crash point)
	surprises   []string // exits nobody asked for
}

// start runs the binary with extra variables added to its environment for
// this run only. A run with a CRASH_POINT is expected to end by itself.
func (p *proc) start(extra ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return fmt.Errorf("%s is already running", p.name)
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.starts++
	fmt.Fprintf(f, "=== e2e: start #%d of %s at %s %s\n", p.starts, p.name, time.Now().Format(time.StampMilli), strings.Join(extra, " "))

	// exec.Command, not CommandContext: nothing may kill a service behind
	// the scenario's back. The scenario kills what it started, by process
	// group, and t.Cleanup makes sure it does.
	cmd := exec.Command(p.bin, p.args...)
	// A clean environment: a CRASH_POINT or LOG_LEVEL in the developer's
	// shell must not leak into a scenario.
	cmd.Env = append(append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, p.env...), extra...)
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group, so a kill reaches anything the service might
	// start; and SIGKILL if the test binary dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	crash := false
	for _, e := range extra {
		crash = crash || strings.HasPrefix(e, "CRASH_POINT=")
	}
	done := make(chan struct{})
	p.cmd, p.done, p.state, p.wantRunning = cmd, done, nil, !crash
	trackProc(p)
	go func() {
		_ = cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		if p.wantRunning && p.cmd == cmd {
			p.surprises = append(p.surprises, fmt.Sprintf("%s exited by itself (%s); see %s", p.name, cmd.ProcessState, p.logPath))
		}
		p.mu.Unlock()
		f.Close()
		close(done)
	}()
	return nil
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// running reports whether the current run is still alive.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

// killGroup sends SIGKILL to the process group and waits for the exit.
// It returns whether the process was running.
func (p *proc) killGroup() bool {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.wantRunning = false
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return false
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		// Unkillable only if stuck in the kernel; nothing more to do.
	}
	return true
}

// stop asks the process to shut down (SIGTERM), as a deployment would, and
// kills it if it has not exited within the grace period. It returns how the
// run ended and whether it ended by itself in time.
func (p *proc) stop(grace time.Duration) (*os.ProcessState, bool) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.wantRunning = false
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return nil, false
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.state, true
	case <-time.After(grace):
		p.killGroup()
		return nil, false
	}
}

// waitExit waits for the current run to end by itself.
func (p *proc) waitExit(timeout time.Duration) (*os.ProcessState, bool) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil, false
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.state, true
	case <-time.After(timeout):
		return nil, false
	}
}

// killedBySIGKILL reports whether a run ended with SIGKILL, which is how
// a crash point ends a process.
func killedBySIGKILL(st *os.ProcessState) bool {
	if st == nil {
		return false
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// waitReady polls the readiness URL until it answers 200. It gives up
// early if the process exits: a crash-point run may end before it is
// ever polled ready, which the caller then judges.
func (p *proc) waitReady(timeout time.Duration) error {
	if p.ready == "" {
		return nil
	}
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := client.Get(p.ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !p.running() {
			return errExited
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready at %s after %s; see %s", p.name, p.ready, timeout, p.logPath)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

var errExited = errors.New("process exited")

// logContains reports whether the process's log has s.
func (p *proc) logContains(s string) bool {
	b, err := os.ReadFile(p.logPath)
	return err == nil && strings.Contains(string(b), s)
}

// takeSurprises returns the unrequested exits seen so far.
func (p *proc) takeSurprises() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.surprises
	p.surprises = nil
	return s
}

func trackProc(p *proc) {
	live.Lock()
	defer live.Unlock()
	live.procs[p] = true
}

func untrackProc(p *proc) {
	live.Lock()
	defer live.Unlock()
	delete(live.procs, p)
}
