package natsserver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/freeport"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

// A three-node cluster holds each stream on every node: with one node
// stopped, publishes are still acknowledged; back, the node catches up.
func TestClusterSurvivesANode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodes, urls, pw := startCluster(ctx, t, 3)

	nc, err := natsbus.Connect(slog.New(slog.DiscardHandler), natsbus.Config{URL: urls, User: natsbus.SenderUser, Password: pw[natsbus.SenderUser], Name: "test"})
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc.Conn)
	require.NoError(t, err)
	publish := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := js.Publish(pctx, natsbus.CreateUserSubject, []byte(`{}`))
			return err == nil
		}, 30*time.Second, 100*time.Millisecond)
	}
	publish()
	nodes[0].Stop()
	publish()
	publish()
	require.NoError(t, nodes[0].Restart(ctx))
	publish()

	_, admin := nodes[1].Admin(t)
	s, err := admin.Stream(ctx, natsbus.CommandStream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas)
	require.Equal(t, uint64(4), info.State.Msgs, "every acknowledged publish is in the stream")
}

// startCluster starts n nodes in t's temporary directory, each routed to
// the others, the way e2e scenario b8 starts its natsd processes
// (StartNode), and provisions them once (ProvisionCluster).
func startCluster(ctx context.Context, t *testing.T, n int) (nodes []*natsserver.Server, urls string, pw map[string]auth.Secret) {
	t.Helper()
	pw = natsserver.RandomPasswords()
	clientPorts, routePorts := make([]int, n), make([]int, n)
	for i := range n {
		clientPorts[i], routePorts[i] = port(t), port(t)
	}
	var all []string
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[j]))
			}
		}
		s, err := natsserver.StartNode(natsserver.Options{
			Dir: filepath.Join(t.TempDir(), fmt.Sprintf("n%d", i+1)), Port: clientPorts[i], Passwords: pw,
			Name: fmt.Sprintf("n%d", i+1), ClusterPort: routePorts[i], Routes: routes,
		})
		require.NoError(t, err)
		t.Cleanup(s.Stop)
		nodes = append(nodes, s)
		all = append(all, s.URL)
	}
	urls = strings.Join(all, ",")
	require.NoError(t, natsserver.ProvisionCluster(ctx, urls, pw[natsserver.AdminUser], n))
	return nodes, urls, pw
}

func port(t *testing.T) int {
	t.Helper()
	addr, err := freeport.Addr()
	require.NoError(t, err)
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}
