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
//
// As a node of a cluster (the e2e suite's, whose nodes it kills with
// SIGKILL), with nothing provisioned: the streams are made once for the
// whole cluster (natsserver.ProvisionCluster), and /readyz answers once
// the node takes connections.
//
//	NATSD_NAME          the node's name (set: a cluster node)
//	NATSD_CLUSTER_PORT  its route port
//	NATSD_ROUTES        the other nodes' routes, comma-separated
//	                    (nats-route://127.0.0.1:port)
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
	o := natsserver.Options{Dir: dir, Port: port, Passwords: passwords, Name: getenv("NATSD_NAME")}
	if o.Name != "" {
		o.ClusterPort, err = strconv.Atoi(getenv("NATSD_CLUSTER_PORT"))
		if err != nil || o.ClusterPort <= 0 {
			bad = append(bad, "NATSD_CLUSTER_PORT: a port number is required with NATSD_NAME")
		}
		for r := range strings.SplitSeq(getenv("NATSD_ROUTES"), ",") {
			if r = strings.TrimSpace(r); r != "" {
				o.Routes = append(o.Routes, r)
			}
		}
		if len(o.Routes) == 0 {
			bad = append(bad, "NATSD_ROUTES: the other nodes' routes are required with NATSD_NAME")
		}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	start := func() (*natsserver.Server, error) { return natsserver.Start(ctx, o) }
	if o.Name != "" {
		start = func() (*natsserver.Server, error) { return natsserver.StartNode(o) }
	}
	srv, err := start()
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
