package usersvc

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/service"
)

// broker is Users' side of the broker transport: the consumer of commands
// and the relay of their answers, on one connection as Users' NATS user.
type broker struct {
	server   *Server
	log      *slog.Logger
	conn     natsbus.Config
	commands *commands
	relay    *relay
	// timeout bounds each relay's wait for publish acknowledgements.
	timeout time.Duration
}

// newBroker returns Users' broker side for s, reaching the broker as conn
// says.
func newBroker(s *Server, cfg Config, conn natsbus.Config) *broker {
	log := s.log.With(slog.String("nats_user", conn.User))
	wake := make(chan struct{}, 1)
	conn.OnLoginRefused = s.metrics.brokerAuthFailures.Inc
	return &broker{
		server: s, log: log, conn: conn, timeout: cfg.DatabaseTimeout,
		commands: &commands{
			log: log, store: s.store, metrics: s.metrics, caller: cfg.NATSCaller,
			maxDeliveries: cfg.CommandMaxDeliveries, concurrency: commandConcurrency,
			retryDelay: time.Second, unreadableDelay: 2 * time.Second,
			progressEvery: natsbus.AckWait / 3,
			answered: func() {
				select {
				case wake <- struct{}{}:
				default: // a wake-up is pending already
				}
			},
		},
		relay: &relay{log: log, store: s.store, metrics: s.metrics, wake: wake, poll: relayPoll, batch: relayBatch},
	}
}

// part is the broker side as one of Users' parts.
func (b *broker) part() service.Part {
	return service.Part{Name: "USERS_NATS_URL=" + natsbus.Redacted(b.conn.URL), Run: b.run}
}

// run connects (in the background while the broker is down), consumes
// commands and relays answers until ctx ends. Then it stops fetching,
// finishes the commands in flight, relays what they answered, and closes
// the connection.
func (b *broker) run(ctx context.Context) error {
	// The server's own logger: the connection names the NATS user itself.
	nc, err := natsbus.Connect(b.server.log, b.conn)
	if err != nil {
		return err
	}
	defer nc.Close()
	b.server.broker.Store(nc)
	js, err := jetstream.New(nc.Conn, jetstream.WithPublishAsyncTimeout(b.timeout))
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	b.relay.js = js
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	var wg sync.WaitGroup
	wg.Go(func() { b.relay.run(relayCtx) })
	wg.Go(func() { b.relay.countUnpublished(relayCtx) })
	err = b.commands.run(ctx, js)
	stopRelay()
	wg.Wait()
	return err
}

// brokerConn is how Users reaches the broker, from cfg.
func brokerConn(cfg Config) natsbus.Config {
	return natsbus.Config{URL: cfg.NATSURL, User: natsbus.UsersUser, Password: cfg.NATSPassword, Name: "users"}
}
