// Package natsserver starts a NATS server with JetStream inside the calling
// process, for tests and for the local run (make run with
// SENDER_TRANSPORT=nats): no download, no Docker. It has one NATS user per
// process with natsbus's permissions, and an admin user that provisions
// the streams and consumers. No shipped binary imports it.
package natsserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/natsbus"
)

// AdminUser may do anything; only the provisioner uses it.
const AdminUser = "admin"

// Server is a running NATS server.
type Server struct {
	srv  *server.Server
	opts Options
	// URL is where clients connect (nats://127.0.0.1:port).
	URL string
	// Passwords are each NATS user's password, by user name.
	Passwords map[string]auth.Secret
}

// Options say where the server keeps its data and listens.
type Options struct {
	Dir  string // JetStream's storage directory
	Port int    // 0: any free port
	// Passwords, when set, are the users' passwords (Restart keeps them);
	// otherwise each is made up.
	Passwords map[string]auth.Secret

	// A cluster's node: its name, route port and the other nodes' routes
	// (nats-route://host:port). Empty Name: a server on its own.
	Name        string
	ClusterPort int
	Routes      []string
}

// LocalStreams are the streams of a server started here: the defaults,
// but for a byte limit of 64 MiB each. JetStream sets a stream's byte
// limit aside on its storage, per replica: the default 1 GiB each would
// ask a developer's machine (or CI's) for gigabytes of free disk per
// server, while tests and the local run hold a few megabytes.
var LocalStreams = func() natsbus.Streams {
	s := natsbus.DefaultStreams
	s.MaxBytes = 64 << 20
	return s
}()

// localMaxStore bounds a server's file storage: enough for its streams,
// whatever the disk has free.
const localMaxStore = 1 << 30

// Start starts a server, provisions the streams and consumers with
// LocalStreams, and returns once both are ready.
func Start(ctx context.Context, o Options) (*Server, error) {
	s, err := newServer(o)
	if err != nil {
		return nil, err
	}
	if err := s.provision(ctx, LocalStreams); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// newServer starts a server and returns once it takes connections.
func newServer(o Options) (*Server, error) {
	pw := o.Passwords
	if pw == nil {
		pw = RandomPasswords()
	}
	users := []*server.User{}
	for _, name := range []string{AdminUser, natsbus.SenderUser, natsbus.UsersUser} {
		u := &server.User{Username: name, Password: string(pw[name])}
		if p, ok := natsbus.PermissionsOf(name); ok {
			u.Permissions = &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: p.Publish},
				Subscribe: &server.SubjectPermission{Allow: p.Subscribe},
			}
		}
		users = append(users, u)
	}
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		Host: "127.0.0.1", Port: port, ServerName: "outboxref-local",
		JetStream: true, StoreDir: o.Dir, JetStreamMaxStore: localMaxStore,
		Users:  users,
		NoLog:  true,
		NoSigs: true,
	}
	if o.Name != "" {
		opts.ServerName = o.Name
		opts.Cluster = server.ClusterOpts{Name: "outboxref", Host: "127.0.0.1", Port: o.ClusterPort}
		for _, r := range o.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, err
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("nats server: not ready within 10s")
	}
	o.Passwords = pw
	o.Port = srv.Addr().(*net.TCPAddr).Port
	return &Server{srv: srv, opts: o, URL: srv.ClientURL(), Passwords: pw}, nil
}

func (s *Server) provision(ctx context.Context, streams natsbus.Streams) error {
	nc, err := nats.Connect(s.URL, nats.UserInfo(AdminUser, string(s.Passwords[AdminUser])))
	if err != nil {
		return fmt.Errorf("nats server: connect as admin: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return natsbus.Provision(ctx, js, streams)
}

// Config is how the process with NATS user name connects.
func (s *Server) Config(user, connName string) natsbus.Config {
	return natsbus.Config{URL: s.URL, User: user, Password: s.Passwords[user], Name: connName}
}

// Admin connects as the admin user, for a test's own looks at the streams.
func (s *Server) Admin(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL, nats.UserInfo(AdminUser, string(s.Passwords[AdminUser])))
	if err != nil {
		t.Fatalf("connect to NATS as admin: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Stop shuts the server down and waits until it has.
func (s *Server) Stop() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Restart starts a stopped server again: the same port, data and
// passwords, so that clients reconnect and the streams hold what they
// held.
func (s *Server) Restart(ctx context.Context) error {
	again, err := newServer(s.opts)
	if err != nil {
		return err
	}
	s.srv = again.srv
	return nil
}

// ForTest starts a server for t in t's temporary directory and stops it
// when t ends.
func ForTest(t testing.TB) *Server {
	t.Helper()
	s, err := Start(context.Background(), Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start an embedded NATS server: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func randomHex() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// StartNode starts one node of a cluster (o.Name, o.ClusterPort and
// o.Routes set) and returns once it takes connections. Nothing is
// provisioned: a cluster's streams are made once, for every node
// (ProvisionCluster).
func StartNode(o Options) (*Server, error) { return newServer(o) }

// ProvisionCluster provisions the streams and consumers with LocalStreams
// and one replica per node on the cluster at urls, as the
// admin, trying again for 30s while JetStream's meta group has no leader
// yet (a cluster just started).
func ProvisionCluster(ctx context.Context, urls string, adminPassword auth.Secret, nodes int) error {
	streams := LocalStreams
	streams.Replicas = nodes
	nc, err := nats.Connect(urls, nats.UserInfo(AdminUser, string(adminPassword)))
	if err != nil {
		return fmt.Errorf("nats cluster: connect as admin: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := natsbus.Provision(pctx, js, streams)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nats cluster: provision: %w", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// RandomPasswords makes up a password for each of the broker's users.
func RandomPasswords() map[string]auth.Secret {
	pw := map[string]auth.Secret{}
	for _, name := range []string{AdminUser, natsbus.SenderUser, natsbus.UsersUser} {
		pw[name] = auth.Secret(randomHex())
	}
	return pw
}
