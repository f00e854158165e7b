//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

// brokerScenarios run the system with SENDER_TRANSPORT=nats: the sender
// publishes commands to a JetStream server, Users reads them and answers
// through its own outbox, the sender links from the replies. The broker is
// an embedded single server (testkit/natsserver) in the suite's process;
// the same checker judges every run.
var brokerScenarios = []scenarioDef{
	{id: "b1-broker-flow", title: "students through the broker, nothing broken",
		opts: scenarioOptions{senders: 1, transport: transportNATS}, run: brokerFlow},
	{id: "b2-broker-users-down", title: "Users stopped for a while under load: commands wait in the stream, not the outbox",
		opts: scenarioOptions{senders: 1, transport: transportNATS}, run: brokerUsersDown},
	{id: "b3-broker-users-crash-before-ack", title: "Users killed between a command's commit and its ack, restarted",
		opts: scenarioOptions{senders: 1, transport: transportNATS, usersCrash: "users-command-after-commit@20"}, run: brokerUsersCrashBeforeAck},
	{id: "b4-broker-sender-kills", title: "sender SIGKILLed at random under load (between publish and recording among others), restarted",
		opts: scenarioOptions{senders: 1, transport: transportNATS}, run: brokerSenderKills},
	{id: "b6-broker-two-users", title: "two Users processes share the commands; one killed between a commit and its ack",
		opts: scenarioOptions{senders: 1, transport: transportNATS}, run: brokerTwoUsers},
	{id: "b7-broker-poison-command", title: "a command Users cannot read, among good ones: parked after a bounded number of deliveries",
		opts: scenarioOptions{senders: 1, transport: transportNATS}, run: brokerPoisonCommand},
	{id: "b8-broker-cluster-node-lost", title: "a three-node cluster with replicated streams; one node killed (SIGKILL) under load, restarted",
		opts: scenarioOptions{senders: 1, transport: transportNATS, brokerNodes: 3}, run: brokerNodeLost},
	{id: "b10-broker-consumer-leader-lost", title: "a three-node cluster; the node leading Users' command consumer killed (SIGKILL) under load: Users reads again within seconds of a new leader",
		opts: scenarioOptions{senders: 1, transport: transportNATS, brokerNodes: 3}, run: brokerConsumerLeaderLost},
	{id: "b9-broker-cut-off-from-sender", title: "the broker unreachable from the sender alone for a while under load; Users still reads and answers",
		opts: scenarioOptions{senders: 1, transport: transportNATS, senderBrokerProxy: true}, run: brokerCutOffFromSender},
	{id: "b5-broker-down", title: "the broker stopped for a while under load, then restarted with its data",
		opts: scenarioOptions{senders: 1, transport: transportNATS}, run: brokerDown},
}

// TestBrokerFaults runs the broker scenarios with the poll source (the
// source and the transport are independent seams; cdc with HTTP is
// TestFaults').
func TestBrokerFaults(t *testing.T) {
	for _, def := range brokerScenarios {
		t.Run(def.id, func(t *testing.T) {
			out := runScenario(t, def, suite.good)
			require.Empty(t, out.violations, "%s (nats): the checker found problems (table above)", def.id)
		})
	}
}

// startBroker starts the scenario's NATS server, or its three-node
// cluster, stopped at cleanup.
func (s *scenario) startBroker() {
	if s.def.opts.brokerNodes > 1 {
		s.startBrokerCluster(s.def.opts.brokerNodes)
		return
	}
	s.broker = natsserver.ForTest(s.t)
	s.brokerURL, s.brokerPasswords = s.broker.URL, s.broker.Passwords
	s.note("broker: an embedded NATS server with JetStream at %s, streams and consumers provisioned", s.broker.URL)
	if s.def.opts.senderBrokerProxy {
		s.brokerToxi = &faultProxy{t: s.t, proxy: startToxiproxy(s.t, filepath.Join(s.dir, "toxiproxy-broker.log"),
			s.def.id+"-broker", strings.TrimPrefix(s.broker.URL, "nats://"))}
		s.note("the senders reach the broker through a proxy of their own; Users directly")
	}
}

// startBrokerCluster starts n NATS nodes, each a process of its own
// (testkit/natsserver/natsd) with its own storage, routed to each other,
// and provisions the streams and consumers with a replica on each node.
func (s *scenario) startBrokerCluster(n int) {
	type ports struct{ client, route, ready string }
	nodes := make([]ports, n)
	for i := range nodes {
		nodes[i] = ports{apitest.FreeAddr(s.t), apitest.FreeAddr(s.t), apitest.FreeAddr(s.t)}
	}
	s.brokerPasswords = natsserver.RandomPasswords()
	var pw, urls []string
	for user, p := range s.brokerPasswords {
		pw = append(pw, user+"="+string(p))
	}
	for i, node := range nodes {
		var routes []string
		for j, other := range nodes {
			if j != i {
				routes = append(routes, "nats-route://"+other.route)
			}
		}
		name := fmt.Sprintf("n%d", i+1)
		p := s.newProc("nats-"+name, s.bins.natsd, "http://"+node.ready+"/readyz",
			"NATSD_NAME="+name, "NATSD_DIR="+filepath.Join(s.dir, "nats-"+name),
			"NATSD_PORT="+portOf(s.t, node.client), "NATSD_CLUSTER_PORT="+portOf(s.t, node.route),
			"NATSD_ROUTES="+strings.Join(routes, ","), "NATSD_READY_ADDR="+node.ready,
			"NATSD_PASSWORDS="+strings.Join(pw, ","))
		s.startProc(p)
		s.brokerNodes = append(s.brokerNodes, p)
		urls = append(urls, "nats://"+node.client)
	}
	s.brokerURL = strings.Join(urls, ",")
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	require.NoError(s.t, natsserver.ProvisionCluster(ctx, s.brokerURL, s.brokerPasswords[natsserver.AdminUser], n))
	s.note("broker: a %d-node NATS cluster, each node a process, streams and consumers replicated on each", n)
}

func portOf(t *testing.T, addr string) string {
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return port
}

// b1. The whole flow through the broker: every student linked once.
func brokerFlow(s *scenario) {
	l := s.startLoad(300, 5*time.Second)
	l.wait(time.Minute)
}

// b2. Users is stopped (SIGTERM) for a few seconds while students keep
// arriving. The sender keeps publishing: the commands wait in the broker's
// stream, and the outbox holds them as published, not pending. Users,
// back, reads them and answers; every student is linked once.
func brokerUsersDown(s *scenario) {
	l := s.startLoad(300, 8*time.Second)
	s.sleep(1500*time.Millisecond, 2000*time.Millisecond)
	if st, inTime := s.users.stop(10 * time.Second); !inTime || !st.Success() {
		s.violate("Users did not shut down cleanly within 10s of SIGTERM (%v)", st)
	}
	time.Sleep(3 * time.Second)
	published := s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'published'")
	pending := s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'pending'")
	s.note("after 3s with Users down: %d rows published (waiting in the stream), %d pending", published, pending)
	if published == 0 {
		s.violate("with Users down no row waited as published: the commands did not wait in the stream")
	}
	s.startProc(s.users)
	l.wait(time.Minute)
}

// b3. Users kills itself after a command's commit and before its ack
// (CRASH_POINT=users-command-after-commit@N), three times, restarted each
// time. The broker delivers each such command again after its ack wait;
// the inbox replays it: no second user, no second answer.
func brokerUsersCrashBeforeAck(s *scenario) {
	l := s.startLoad(200, 6*time.Second)
	crashes := 0
	for _, next := range []string{"users-command-after-commit@20", "users-command-after-commit@40", ""} {
		if s.expectCrash(s.users, "users-command-after-commit", 30*time.Second) {
			crashes++
		}
		if next != "" {
			s.startProc(s.users, "CRASH_POINT="+next)
		} else {
			s.startProc(s.users)
		}
	}
	l.wait(time.Minute)
	s.note("Users crashed between commit and ack %d times", crashes)
	// Each crash left a committed command unacked. Its answer was in
	// Users' outbox already, so the student is linked without it; the
	// broker delivers the command again once the consumer's ack wait
	// (natsbus.AckWait) has passed, and the inbox replays it.
	start := time.Now()
	s.eventually(natsbus.AckWait+30*time.Second, "the broker delivered each unacked command again and Users replayed it", func() bool {
		return s.count(s.usersDB, "SELECT COALESCE(sum(replays), 0) FROM inbox") >= crashes
	})
	s.note("the unacked commands came again %s after the last crash, and were replayed", time.Since(start).Round(time.Second))
	s.minReplays = crashes
}

// b4. The sender is SIGKILLed at random moments under load and restarted:
// some kills land between a publish and the recording of its
// acknowledgement. The row's lease brings it back, it is published again
// under the same key, and the broker drops the repeat (or, past its
// window, Users replays it).
func brokerSenderKills(s *scenario) {
	l := s.startLoad(300, 10*time.Second)
	sender := s.senders[0]
	kills := 0
	for range 5 {
		s.sleep(500*time.Millisecond, 1500*time.Millisecond)
		if sender.killGroup() {
			kills++
		}
		s.sleep(0, 300*time.Millisecond)
		s.startProc(sender)
	}
	l.wait(time.Minute)
	s.note("sender SIGKILLed %d times under load", kills)
}

// b5. The broker stops for a few seconds under load and comes back with
// its data. Meanwhile the sender's publishes fail (rows wait as pending,
// retried as broker-unreachable) and Users' relay cannot publish answers
// (they wait in Users' outbox). Everything drains once it is back.
func brokerDown(s *scenario) {
	l := s.startLoad(300, 8*time.Second)
	s.sleep(1500*time.Millisecond, 2000*time.Millisecond)
	s.broker.Stop()
	time.Sleep(3 * time.Second)
	waiting := s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'pending' AND reason_class = 'broker-unreachable'")
	s.note("after 3s with the broker down: %d rows retried as broker-unreachable", waiting)
	if waiting == 0 {
		s.violate("with the broker down no row was retried as broker-unreachable")
	}
	ctx, cancel := context.WithTimeout(s.ctx, 20*time.Second)
	defer cancel()
	if err := s.broker.Restart(ctx); err != nil {
		s.violate("restart the broker: %v", err)
		return
	}
	s.note("the broker restarted with its data after 3s")
	l.wait(time.Minute)
}

// b9. The sender loses the broker (its connections closed, new ones
// refused) while Users keeps its own: publishes fail and rows are retried
// as broker-unreachable, the commands already published are answered by
// Users, and their replies wait in the reply stream. Healed, the sender
// publishes what waited and reads the replies; every student is linked
// once.
func brokerCutOffFromSender(s *scenario) {
	l := s.startLoad(300, 8*time.Second)
	s.sleep(1500*time.Millisecond, 2000*time.Millisecond)
	answeredBefore := s.count(s.usersDB, "SELECT count(*) FROM answers")
	s.brokerToxi.disable()
	time.Sleep(3 * time.Second)
	retried := s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'pending' AND reason_class = 'broker-unreachable'")
	published := s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'published'")
	answered := s.count(s.usersDB, "SELECT count(*) FROM answers") - answeredBefore
	s.note("after 3s cut off from the sender: %d rows retried as broker-unreachable, %d waiting as published, %d answers written by Users meanwhile",
		retried, published, answered)
	if retried == 0 {
		s.violate("with the broker cut off from the sender no row was retried as broker-unreachable")
	}
	s.brokerToxi.enable()
	s.note("the sender's way to the broker healed after 3s")
	l.wait(time.Minute)
}

// secondUsers prepares another Users process on the same database and
// broker, with ports of its own: it shares the command consumer's work.
func (s *scenario) secondUsers() *proc {
	httpAddr, adminAddr := apitest.FreeAddr(s.t), apitest.FreeAddr(s.t)
	var env []string
	for _, kv := range s.users.env {
		switch {
		case strings.HasPrefix(kv, "USERS_HTTP_ADDR="):
			kv = "USERS_HTTP_ADDR=" + httpAddr
		case strings.HasPrefix(kv, "USERS_ADMIN_ADDR="):
			kv = "USERS_ADMIN_ADDR=" + adminAddr
		}
		env = append(env, kv)
	}
	return s.newProc("users-2", s.users.bin, "http://"+httpAddr+"/readyz", env...)
}

// b6. Two Users processes read the one durable consumer, so they share
// the commands. One of them kills itself after a command's commit and
// before its ack; the broker delivers that command again, to either of
// them, and the inbox replays it. The other keeps answering meanwhile.
func brokerTwoUsers(s *scenario) {
	second := s.secondUsers()
	s.startProc(second, "CRASH_POINT=users-command-after-commit@15")
	l := s.startLoad(300, 6*time.Second)
	crashed := s.expectCrash(second, "users-command-after-commit", 30*time.Second)
	s.startProc(second)
	l.wait(time.Minute)
	first := s.count(s.usersDB, "SELECT count(*) FROM inbox") // every command, by either
	s.note("two Users processes shared %d commands; the second crashed between a commit and its ack: %v", first, crashed)
	if crashed {
		s.eventually(natsbus.AckWait+30*time.Second, "the unacked command delivered again and replayed", func() bool {
			return s.count(s.usersDB, "SELECT COALESCE(sum(replays), 0) FROM inbox") >= 1
		})
		s.minReplays = 1
	}
	// The crash point counts the commands its process committed: a crash
	// at the 15th shows the second Users took its share of the work.
	if !crashed {
		s.violate("the second Users never reached its 15th command: the two did not share the consumer")
	}
}

// b7. A command Users cannot read (no idempotency key; data not JSON) is
// published among the good ones. Users hands it back until
// USERS_COMMAND_MAX_DELIVERIES deliveries, then parks it where an
// operator sees it (parked_commands, users_commands_total{outcome="parked"})
// and terminates it on the stream; nothing behind it waits for it.
func brokerPoisonCommand(s *scenario) {
	l := s.startLoad(200, 4*time.Second)
	nc, err := natsbus.Connect(slog.New(slog.DiscardHandler), natsbus.Config{URL: s.brokerURL, User: natsbus.SenderUser,
		Password: s.brokerPasswords[natsbus.SenderUser], Name: "e2e poison"})
	require.NoError(s.t, err)
	defer nc.Close()
	js, err := jetstream.New(nc.Conn)
	require.NoError(s.t, err)
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	_, err = js.Publish(ctx, natsbus.CreateUserSubject, []byte("this is not a command"))
	require.NoError(s.t, err)
	l.wait(time.Minute)
	s.eventually(30*time.Second, "the unreadable command parked", func() bool {
		return s.count(s.usersDB, "SELECT count(*) FROM parked_commands") == 1
	})
	deliveries := s.count(s.usersDB, "SELECT deliveries FROM parked_commands")
	s.note("the unreadable command was parked after %d deliveries; the 200 students around it were linked", deliveries)
	if deliveries < 1 || deliveries > 5 {
		s.violate("the unreadable command was parked after %d deliveries, want 1 to USERS_COMMAND_MAX_DELIVERIES (5)", deliveries)
	}
}

// b8. The broker is a three-node cluster, each node a process, with every
// stream and consumer replicated on each node. Under load, the node the
// clients are most likely on (the first in their list) is killed with
// SIGKILL: its connections drop, and what it had not written to disk is
// lost with it. Clients move to another, streams keep a quorum and go on.
// The node comes back on its data and catches up from the others. Every
// student is linked once.
func brokerNodeLost(s *scenario) {
	l := s.startLoad(300, 10*time.Second)
	s.sleep(1500*time.Millisecond, 2500*time.Millisecond)
	node := s.brokerNodes[0]
	if !node.killGroup() {
		s.violate("broker node n1 was not running when it was to be killed")
	}
	s.note("broker node n1 killed (SIGKILL) under load")
	time.Sleep(3 * time.Second)
	s.startProc(node)
	s.note("broker node n1 restarted on its data after 3s")
	l.wait(time.Minute)
}

// maxConsumerStall is the longest Users may read no command after the node
// leading its consumer dies, a new leader elected within seconds: a
// reader pulls again within natsbus.PullExpiry of losing the old one.
// Before, the client's 30-second heartbeat check decided, and every such
// loss cost 30 seconds.
const maxConsumerStall = 15 * time.Second

// b10. The node that leads Users' durable consumer (each consumer of a
// replicated stream has a leader of its own) is killed with SIGKILL under
// load. Its pull requests die with it. The stall is the longest gap
// between two commands Users committed around the kill, while students
// keep arriving; the same for the replies the sender applied. Both must
// be seconds, not the half-minute a missed heartbeat used to take.
func brokerConsumerLeaderLost(s *scenario) {
	l := s.startLoad(400, 12*time.Second)
	s.sleep(2000*time.Millisecond, 2500*time.Millisecond)
	leader, err := s.consumerLeader(natsbus.CommandStream, natsbus.UsersConsumer)
	if err != nil {
		s.violate("find the leader of Users' consumer: %v", err)
		l.wait(time.Minute)
		return
	}
	var node *proc
	var others []string
	for i, n := range s.brokerNodes {
		if n.name == "nats-"+leader {
			node = n
		} else {
			others = append(others, strings.Split(s.brokerURL, ",")[i])
		}
	}
	if node == nil {
		s.violate("no broker node is named %q, the leader of Users' consumer", leader)
		l.wait(time.Minute)
		return
	}
	// Users moves to the other nodes first: a reader connected to the
	// dying leader notices its connection drop and pulls again at once;
	// one connected elsewhere, whose pulls the leader served through the
	// cluster, hears nothing, the case that stalled.
	for i, kv := range s.users.env {
		if strings.HasPrefix(kv, "USERS_NATS_URL=") {
			s.users.env[i] = "USERS_NATS_URL=" + strings.Join(others, ",")
		}
	}
	if st, inTime := s.users.stop(10 * time.Second); !inTime || !st.Success() {
		s.violate("Users did not shut down cleanly within 10s of SIGTERM (%v)", st)
	}
	s.startProc(s.users)
	s.sleep(1000*time.Millisecond, 1500*time.Millisecond)
	if !node.killGroup() {
		s.violate("the node %q leading Users' consumer was not running to be killed", leader)
		l.wait(time.Minute)
		return
	}
	killed := time.Now()
	s.note("Users restarted on the other nodes; broker node %s, the leader of Users' command consumer, killed (SIGKILL) under load", leader)
	l.wait(time.Minute)
	s.startProc(node)
	s.note("broker node %s restarted on its data", leader)
	window := func(table, column string) time.Duration {
		// The longest gap between consecutive rows in the 30 seconds
		// from 2 seconds before the kill, as the database's clock has it.
		var gap float64
		q := fmt.Sprintf(`SELECT COALESCE(max(g), 0) FROM (
			SELECT extract(epoch FROM %[2]s - lag(%[2]s) OVER (ORDER BY %[2]s)) AS g FROM %[1]s
			WHERE %[2]s BETWEEN $1::timestamptz - interval '2 seconds' AND $1::timestamptz + interval '30 seconds') t`, table, column)
		pool := s.usersDB
		if table == "reply_inbox" {
			pool = s.studentDB
		}
		if err := pool.QueryRow(s.ctx, q, killed).Scan(&gap); err != nil {
			s.violate("measure the gap in %s: %v", table, err)
		}
		return time.Duration(gap * float64(time.Second))
	}
	commands, replies := window("inbox", "created_at"), window("reply_inbox", "received_at")
	s.note("around the kill, the longest time Users committed no command: %s; the sender applied no reply: %s",
		commands.Round(10*time.Millisecond), replies.Round(10*time.Millisecond))
	if commands > maxConsumerStall {
		s.violate("Users read no command for %s after the leader of its consumer died (at most %s)", commands.Round(time.Millisecond), maxConsumerStall)
	}
	if replies > maxConsumerStall {
		s.violate("the sender applied no reply for %s after the node died (at most %s)", replies.Round(time.Millisecond), maxConsumerStall)
	}
}

// consumerLeader names the node leading a durable consumer, as the
// broker's admin sees it.
func (s *scenario) consumerLeader(stream, consumer string) (string, error) {
	nc, err := natsbus.Connect(slog.New(slog.DiscardHandler), natsbus.Config{URL: s.brokerURL, User: natsserver.AdminUser,
		Password: s.brokerPasswords[natsserver.AdminUser], Name: "e2e leader lookup"})
	if err != nil {
		return "", err
	}
	defer nc.Close()
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return "", err
	}
	info := cons.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("consumer %s on %s has no leader", consumer, stream)
	}
	return info.Cluster.Leader, nil
}
