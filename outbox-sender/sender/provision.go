package sender

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/service"
)

const (
	// provisionTimeout bounds "provision-broker": a cluster that has just
	// started elects its JetStream leader within seconds.
	provisionTimeout = 2 * time.Minute
	// provisionTry bounds one try at all four requests (two streams, two
	// consumers). The broker answers each in milliseconds, or in seconds
	// while a cluster elects a leader; an answer can also be lost (the
	// connection dropped under the request, a node died holding it), and
	// the request then waits for nothing. Bounded, the try gives up and
	// the next one asks again.
	provisionTry = 10 * time.Second
)

// provisionBroker creates or updates the broker's streams and durable
// consumers (natsbus.Provision) as the broker's admin, and returns once
// they exist: the one-shot job a deployment runs before the sender and
// Users, neither of which may create them. Compose runs it once, so it
// tries until provisionTimeout is spent.
func provisionBroker(ctx context.Context, cfg Config, stdout io.Writer) error {
	return provision(ctx, cfg, stdout, provisionTimeout, provisionTry)
}

// provision tries, each try bounded by try, until the streams and
// consumers exist or budget is spent. Every request is a create-or-update,
// so a try that did part of the work (or all of it, its answers lost)
// is simply made again.
func provision(ctx context.Context, cfg Config, stdout io.Writer, budget, try time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	// A refused login (the admin's password) is logged as it happens.
	log, err := service.NewLogger(stdout, cfg.LogLevel)
	if err != nil {
		return err
	}
	nc, err := natsbus.Connect(log, natsbus.Config{URL: cfg.NATSURL, User: cfg.NATSAdminUser, Password: cfg.NATSAdminPassword, Name: "outbox-sender provision-broker"})
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	streams := natsbus.DefaultStreams
	streams.Replicas = cfg.NATSReplicas
	streams.MaxBytes = int64(cfg.NATSStreamMaxBytes)
	for n := 1; ; n++ {
		tctx, cancelTry := context.WithTimeout(ctx, try)
		err := natsbus.Provision(tctx, js, streams)
		cancelTry()
		if err == nil {
			fmt.Fprintf(stdout, "provisioned streams %s and %s (%d replicas, %d bytes each at most) with consumers %s and %s at %s\n",
				natsbus.CommandStream, natsbus.ReplyStream, streams.Replicas, streams.MaxBytes, natsbus.UsersConsumer, natsbus.SenderConsumer, natsbus.Redacted(cfg.NATSURL))
			return nil
		}
		fmt.Fprintf(stdout, "provision-broker: try %d failed, trying again: %v\n", n, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("provision-broker: gave up after %s and %d tries: %w", budget, n, err)
		case <-time.After(time.Second):
		}
	}
}
