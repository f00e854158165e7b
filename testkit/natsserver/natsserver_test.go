package natsserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

// A three-node cluster holds each stream on every node: with one node
// stopped, publishes are still acknowledged; back, the node catches up.
func TestClusterSurvivesANode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := natsserver.StartCluster(ctx, t.TempDir(), 3)
	require.NoError(t, err)
	t.Cleanup(c.Stop)

	nc, err := natsbus.Connect(c.Config(natsbus.SenderUser, "test"))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
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
	c.Nodes[0].Stop()
	publish()
	publish()
	require.NoError(t, c.Nodes[0].Restart(ctx))
	publish()

	_, admin := c.Nodes[1].Admin(t)
	s, err := admin.Stream(ctx, natsbus.CommandStream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas)
	require.Equal(t, uint64(4), info.State.Msgs, "every acknowledged publish is in the stream")
}
