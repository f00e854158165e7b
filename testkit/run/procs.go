package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// proc is one of the system's processes.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when the process has exited
	err     error         // why it exited, once exited is closed
}

// startProc starts bin with env in a process group of its own, its output
// in logDir/name.log. It dies with make run (Pdeathsig), even if make run
// is killed too hard to stop it.
func startProc(name, bin string, args, env []string, logDir string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = out.Close()
		close(p.exited)
	}()
	return p, nil
}

// runOnce runs bin to completion (a migration), its output in the log.
func runOnce(ctx context.Context, name, bin string, args, env []string, logDir string) error {
	p, err := startProc(name, bin, args, env, logDir)
	if err != nil {
		return err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		p.stop()
		return ctx.Err()
	}
	if p.err != nil {
		return fmt.Errorf("%s: %w\n%s", name, p.err, p.tail())
	}
	return nil
}

// waitReady waits until url answers 200, the process dies, or timeout.
func (p *proc) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready (%w):\n%s", p.name, p.err, p.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready at %s within %s:\n%s", p.name, url, timeout, p.tail())
		}
	}
}

// stop asks the process to stop (SIGTERM: each binary shuts down
// gracefully, the sender hands back what it claimed) and kills its group
// if it has not within 15 seconds.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// tail is the end of the process's log, for an error message.
func (p *proc) tail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "  " + strings.Join(lines, "\n  ") + "\n  (the whole log: " + p.logPath + ")"
}

// exitedEarly says which of procs has exited, if any has.
func exitedEarly(procs []*proc) error {
	var errs []error
	for _, p := range procs {
		select {
		case <-p.exited:
			errs = append(errs, fmt.Errorf("%s stopped by itself (%w):\n%s", p.name, p.err, p.tail()))
		default:
		}
	}
	return errors.Join(errs...)
}
