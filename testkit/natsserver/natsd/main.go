// Command natsd runs natsserver's NATS server (JetStream, one user per
// process with natsbus's permissions, the streams provisioned) as a
// process of its own, until SIGTERM or SIGINT. The bench starts it beside
// the binaries when it measures SENDER_TRANSPORT=nats, so that the
// broker's CPU is counted as a process's, as the others' are.
//
//	NATSD_DIR          JetStream's storage directory (required)
//	NATSD_PORT         client port (required)
//	NATSD_READY_ADDR   host:port where GET /readyz answers 200 once the
//	                   streams are provisioned (required)
//	NATSD_PASSWORDS    user=password,user=password: the users' passwords
//	                   (required: admin, outbox-sender and users)
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "natsd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string) error {
	dir, readyAddr := getenv("NATSD_DIR"), getenv("NATSD_READY_ADDR")
	port, err := strconv.Atoi(getenv("NATSD_PORT"))
	var bad []string
	if dir == "" {
		bad = append(bad, "NATSD_DIR: required")
	}
	if err != nil || port <= 0 {
		bad = append(bad, "NATSD_PORT: a port number is required")
	}
	if readyAddr == "" {
		bad = append(bad, "NATSD_READY_ADDR: required")
	}
	passwords := map[string]auth.Secret{}
	for pair := range strings.SplitSeq(getenv("NATSD_PASSWORDS"), ",") {
		if user, pw, ok := strings.Cut(pair, "="); ok && pw != "" {
			passwords[user] = auth.Secret(pw)
		}
	}
	for _, user := range []string{natsserver.AdminUser, natsbus.SenderUser, natsbus.UsersUser} {
		if passwords[user] == "" {
			bad = append(bad, "NATSD_PASSWORDS: no password for "+user)
		}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	srv, err := natsserver.Start(ctx, natsserver.Options{Dir: dir, Port: port, Passwords: passwords})
	if err != nil {
		return err
	}
	defer srv.Stop()
	ln, err := net.Listen("tcp", readyAddr)
	if err != nil {
		return fmt.Errorf("NATSD_READY_ADDR: %w", err)
	}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = hs.Serve(ln) }()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}
