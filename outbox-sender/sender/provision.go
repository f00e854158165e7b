package sender

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxref/outboxref/internal/natsbus"
)

// provisionTimeout bounds "provision-broker": a cluster that has just
// started elects its JetStream leader within seconds.
const provisionTimeout = 2 * time.Minute

// provisionBroker creates or updates the broker's streams and durable
// consumers (natsbus.Provision) as the broker's admin, and returns once
// they exist: the one-shot job a deployment runs before the sender and
// Users, neither of which may create them. While the broker (or its
// cluster's JetStream leader) is not there yet, it tries again.
func provisionBroker(ctx context.Context, cfg Config, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, provisionTimeout)
	defer cancel()
	nc, err := natsbus.Connect(natsbus.Config{URL: cfg.NATSURL, User: cfg.NATSAdminUser, Password: cfg.NATSAdminPassword, Name: "outbox-sender provision-broker"})
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	streams := natsbus.DefaultStreams
	streams.Replicas = cfg.NATSReplicas
	streams.MaxBytes = int64(cfg.NATSStreamMaxBytes)
	for {
		err := natsbus.Provision(ctx, js, streams)
		if err == nil {
			fmt.Fprintf(stdout, "provisioned streams %s and %s (%d replicas, %d bytes each at most) with consumers %s and %s at %s\n",
				natsbus.CommandStream, natsbus.ReplyStream, streams.Replicas, streams.MaxBytes, natsbus.UsersConsumer, natsbus.SenderConsumer, natsbus.Redacted(cfg.NATSURL))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("provision-broker: gave up after %s: %w", provisionTimeout, err)
		case <-time.After(time.Second):
		}
	}
}
