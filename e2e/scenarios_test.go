//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/invariant"
)

// scenarios are the faults of the issues, in order: the ten of the first,
// and three frozen database connections (11 to 13). Each builds a fresh
// system, breaks it, heals it, and leaves the verdict to the checker. They
// run one after another: with two cores, running them side by side would
// turn timing into the thing under test. TestFaults runs each with both
// sources of new rows, the poll and the replication slot (cdc), unless its
// sources say otherwise; the faults of the cdc source alone follow in
// cdcScenarios (cdc_scenarios_test.go).
var scenarios = []scenarioDef{
	{id: "01-response-lost", title: "Users commits but its answer never reaches the sender",
		opts: scenarioOptions{senders: 1}, run: responseLost},
	{id: "02-sender-crash-point", title: "sender killed between Users' answer and recording it, then restarted",
		opts: scenarioOptions{senders: 0}, run: senderCrashPoint},
	{id: "03-sender-random-kills", title: "sender SIGKILLed at random moments under load, restarted each time",
		opts: scenarioOptions{senders: 1, latency: 200 * time.Millisecond}, run: senderRandomKills},
	{id: "04-users-kills", title: "Users killed at its post-commit crash point and at random, restarted",
		opts: scenarioOptions{senders: 1, usersCrash: "users-after-commit@5"}, run: usersKills},
	{id: "05-users-5xx-and-slow", title: "Users answers 5xx, then is slower than the sender's timeout, then recovers",
		opts: scenarioOptions{senders: 1, httpFaults: true}, run: usersErrorsAndSlow},
	{id: "06-partition", title: "network partition between sender and Users, then healed",
		opts: scenarioOptions{senders: 1, latency: 100 * time.Millisecond}, run: partition},
	{id: "07-database-restarts", title: "Student's database killed and restarted under load, then Users' database",
		opts: scenarioOptions{senders: 1, ownClusters: true, latency: 100 * time.Millisecond}, run: databaseRestarts},
	{id: "08-three-senders", title: "three senders on one outbox under load, with sender kills",
		opts: scenarioOptions{senders: 3, latency: 250 * time.Millisecond}, run: threeSenders},
	{id: "09-poison-row", title: "a document number already taken in Users by another key",
		opts: scenarioOptions{senders: 1}, run: poisonRow},
	// No sender takes part: the source of new rows cannot matter.
	{id: "10-idempotent-bursts", title: "bursts of identical POST /users with one key, straight at Users",
		opts: scenarioOptions{senders: 0}, run: idempotentBursts, sources: []string{noSender}},
	{id: "11-frozen-record", title: "the sender's connection to Student's database freezes as it sends a recording",
		opts: scenarioOptions{senders: 0, senderDBProxy: true}, run: frozenRecord},
	// The pause point is in the poll's claim of due rows, which a cdc
	// sender makes only for retries and rows the stream missed; the
	// stream's claim of new rows is another statement with the same
	// deadline. Run with cdc, the scenario would freeze a claim that
	// claims nothing and test nothing new.
	{id: "12-frozen-claim", title: "the sender's connection to Student's database freezes as it sends a claim",
		opts: scenarioOptions{senders: 0, senderDBProxy: true}, run: frozenClaim, sources: []string{sourcePoll}},
	{id: "13-frozen-inbox", title: "Users' connection to its database freezes as it sends a create-user",
		opts: scenarioOptions{senders: 1, usersDBProxy: true, usersPause: "users-before-inbox@20"}, run: frozenInbox},
}

// TestFaults runs every scenario against the real binaries, once per
// source of new rows: TestFaults/01-response-lost/poll, .../cdc.
func TestFaults(t *testing.T) {
	for _, def := range append(append([]scenarioDef(nil), scenarios...), cdcScenarios...) {
		sources := def.sources
		if sources == nil {
			sources = []string{sourcePoll, sourceCDC}
		}
		t.Run(def.id, func(t *testing.T) {
			for _, source := range sources {
				t.Run(source, func(t *testing.T) {
					d := def
					d.opts.source = source
					out := runScenario(t, d, suite.good)
					require.Empty(t, out.violations, "%s (%s): the checker found problems (table above)", def.id, source)
				})
			}
		})
	}
}

// 1. The sender's request reaches Users, Users commits and answers, and the
// answer is reset on its way back (reset_peer on the downstream direction).
// A naive sender that retried with a new key, or a Users without an inbox,
// would create a second user or be refused; here every retry must get the
// stored userId back.
func responseLost(s *scenario) {
	const n = 200
	s.toxi.add("lose-answers", "reset_peer", "downstream", map[string]any{"timeout": 0})
	l := s.startLoad(n, 2*time.Second)
	s.eventually(45*time.Second, fmt.Sprintf("Users committed %d users while every answer was lost", n), func() bool {
		return s.count(s.usersDB, "SELECT count(*) FROM users") >= n
	})
	l.wait(time.Minute)
	linked := s.count(s.studentDB, "SELECT count(*) FROM students WHERE user_id IS NOT NULL")
	s.note("while answers were lost: %d users committed in Users, %d students linked",
		s.count(s.usersDB, "SELECT count(*) FROM users"), linked)
	if linked != 0 {
		s.violate("%d students were linked although no answer could reach the sender", linked)
	}
	s.toxi.remove("lose-answers")
	// Every student's first answer was lost, so the answer that finally
	// linked it was a replay from the inbox.
	s.minReplays = n
}

// 2. The sender crashes exactly after Users answered and before the answers
// are recorded (CRASH_POINT=sender-after-response). The rows it held come
// due again when their lease ends; the next sender redelivers them and
// Users replays. A sender that marked rows delivered before sending would
// leave those students without a user.
func senderCrashPoint(s *scenario) {
	s.startLoad(150, 3*time.Second)
	sender := s.newSender()
	crashes := 0
	for _, spec := range []string{"sender-after-response", "sender-after-response@3", "sender-after-response@5"} {
		s.startProc(sender, "CRASH_POINT="+spec)
		if s.expectCrash(sender, "sender-after-response", 30*time.Second) {
			crashes++
		}
	}
	s.note("sender crashed at sender-after-response %d times (runs: 1st, 3rd and 5th hit)", crashes)
	s.startProc(sender)
	// Each crash dropped at least one answer Users had committed.
	s.minReplays = crashes
}

// 3. The sender is SIGKILLed at random moments while students keep
// arriving, and restarted each time: claims in flight, requests in flight,
// batches half recorded. Leases bring the rows back. Then it is restarted
// twice the polite way (SIGTERM, as a deployment does), which must hand
// back the rows it claimed but has not sent, finish what is in flight, and
// exit 0.
func senderRandomKills(s *scenario) {
	l := s.startLoad(400, 13*time.Second)
	sender := s.senders[0]
	kills := 0
	for range 6 {
		s.sleep(500*time.Millisecond, 1500*time.Millisecond)
		if sender.killGroup() {
			kills++
		}
		s.sleep(0, 300*time.Millisecond)
		s.startProc(sender)
	}
	for range 2 {
		s.sleep(500*time.Millisecond, 1500*time.Millisecond)
		st, inTime := sender.stop(10 * time.Second)
		if !inTime || !st.Success() {
			s.violate("the sender did not shut down cleanly within 10s of SIGTERM (%v)", st)
		}
		s.startProc(sender)
	}
	l.wait(time.Minute)
	s.note("sender SIGKILLed %d times under load, then stopped with SIGTERM and restarted twice", kills)
	// With answers taking 200ms, a kill lands on deliveries in flight: the
	// rows it held must come back through their leases.
	s.minRedeliv = 1
}

// 4. Users kills itself right after committing, before answering
// (CRASH_POINT=users-after-commit@N), three times; then it is SIGKILLed at
// random moments three times. Each restart comes back on the same port.
// The sender sees a dropped connection for an operation that happened, and
// must get the stored result when it asks again.
func usersKills(s *scenario) {
	l := s.startLoad(300, 12*time.Second)
	crashes := 0
	for _, next := range []string{"users-after-commit@20", "users-after-commit@40", ""} {
		if s.expectCrash(s.users, "users-after-commit", 30*time.Second) {
			crashes++
		}
		if next != "" {
			s.startProc(s.users, "CRASH_POINT="+next)
		} else {
			s.startProc(s.users)
		}
	}
	kills := 0
	for range 3 {
		s.sleep(300*time.Millisecond, 1500*time.Millisecond)
		if s.users.killGroup() {
			kills++
		}
		s.startProc(s.users)
	}
	l.wait(time.Minute)
	s.note("Users crashed at users-after-commit %d times and was SIGKILLed %d more times", crashes, kills)
	// Each crash-point crash left one committed user whose answer never
	// left Users; its key is replayed when the sender asks again.
	s.minReplays = crashes
}

// 5. Users is unhealthy for a while: first a gateway answers 503 without
// passing requests on; then requests reach Users, which commits, and the
// gateway replaces the answer with 502; then answers are slower (latency
// toxic, downstream) than SENDER_REQUEST_TIMEOUT. Then everything recovers.
// A sender that dead-lettered on 5xx or on a timeout would give up on
// students whose users exist; one that retried with a new key would
// duplicate them.
func usersErrorsAndSlow(s *scenario) {
	l := s.startLoad(300, 12*time.Second)
	time.Sleep(time.Second)
	s.faults.set(reject503)
	time.Sleep(3 * time.Second)
	s.faults.set(replace502)
	time.Sleep(3 * time.Second)
	s.faults.set(passThrough)
	s.toxi.add("slow-answers", "latency", "downstream", map[string]any{"latency": int(requestTimeout.Milliseconds()) + 500, "jitter": 0})
	time.Sleep(3 * time.Second)
	s.toxi.remove("slow-answers")
	l.wait(time.Minute)
	s.note("503 without forwarding: %d answers; 502 after Users committed: %d answers for %d operations; then 3s of answers %s late",
		s.faults.rejected.Load(), s.faults.replaced.Load(), s.faults.keysReplaced(), requestTimeout+500*time.Millisecond)
	// Every operation whose answer was replaced had happened, so its key
	// must have been replayed at least once.
	s.minReplays = s.faults.keysReplaced()
}

// 6. The network between the sender and Users drops everything in both
// directions for five seconds (timeout toxics with timeout 0: data is
// swallowed, connections hang), heals, and then the proxy refuses
// connections for three seconds. Requests caught in the partition may or
// may not have reached Users; the retries must sort that out.
func partition(s *scenario) {
	l := s.startLoad(300, 12*time.Second)
	time.Sleep(1500 * time.Millisecond)
	before := s.count(s.studentDB, "SELECT count(*) FROM students WHERE user_id IS NOT NULL")
	s.toxi.add("partition-requests", "timeout", "upstream", map[string]any{"timeout": 0})
	s.toxi.add("partition-answers", "timeout", "downstream", map[string]any{"timeout": 0})
	time.Sleep(5 * time.Second)
	during := s.count(s.studentDB, "SELECT count(*) FROM students WHERE user_id IS NOT NULL")
	s.toxi.remove("partition-requests")
	s.toxi.remove("partition-answers")
	time.Sleep(1500 * time.Millisecond)
	s.toxi.disable()
	time.Sleep(3 * time.Second)
	s.toxi.enable()
	l.wait(time.Minute)
	s.note("partition: %d students linked before it, %d at its end (answers in flight may land); then 3s of connection refused",
		before, during)
	// Students kept arriving during the partition, so some deliveries
	// must have failed and been retried.
	s.minRedeliv = 1
}

// 7. Student's database is killed (SIGKILL to the postmaster, crash
// recovery on restart) while the sender and the load run, and stays down
// for five seconds: longer than the sender's retries of a batch write, so
// answers it holds are abandoned to their leases and redelivered. Then
// Users' database is killed the same way. Commits are durable, so every
// student Student acknowledged must still exist.
func databaseRestarts(s *scenario) {
	l := s.startLoad(300, 14*time.Second)
	time.Sleep(2 * time.Second)
	require.NoError(s.t, s.studentCluster.Kill())
	time.Sleep(5 * time.Second)
	require.NoError(s.t, s.studentCluster.Restart(s.ctx))
	time.Sleep(3 * time.Second)
	require.NoError(s.t, s.usersCluster.Kill())
	time.Sleep(4 * time.Second)
	require.NoError(s.t, s.usersCluster.Restart(s.ctx))
	l.wait(2 * time.Minute)
	s.note("Student's database down 5s, Users' database down 4s, both by SIGKILL with crash recovery")
}

// 8. Three senders share one outbox (FOR UPDATE SKIP LOCKED, leases) under
// load, and one of them at random is SIGKILLed and restarted six times.
// Answers take 250ms, so each sender always has deliveries in flight when
// it dies. No row may become two users, and rows a dead sender held must be
// taken over by the others once their leases end.
func threeSenders(s *scenario) {
	l := s.startLoad(450, 10*time.Second)
	kills := 0
	for i := range 6 {
		s.sleep(500*time.Millisecond, 1500*time.Millisecond)
		victim := s.senders[s.rng.IntN(len(s.senders))]
		// With cdc only the sender that streams claims new rows; the others
		// stand by and hold little. Killing only those (one run in eleven,
		// by chance) would leave nothing to redeliver: the first kill is
		// of the one that streams.
		if i == 0 && s.source == sourceCDC {
			for _, p := range s.senders {
				if s.readingSlot(p) {
					victim = p
				}
			}
		}
		if victim.killGroup() {
			kills++
		}
		s.sleep(0, 500*time.Millisecond)
		s.startProc(victim)
	}
	l.wait(time.Minute)
	s.note("3 senders, %d kills of a random one", kills)
	s.minRedeliv = 1
}

// 9. A user with document number S09-POISON already exists in Users,
// created under a key of its own. A student with that document number is
// a poison row: Users refuses it (409, document number taken) and stores
// the refusal under the row's key. The row must be dead-lettered with
// that reason, and every other student must still link.
func poisonRow(s *scenario) {
	const poisonDoc = "S09-POISON"
	seedKey := "seed-" + uuid.NewString()
	body, _ := json.Marshal(personBody{Name: "Someone Else", Email: "someone@example.com", DocumentNumber: poisonDoc})
	status, answer, _, err := postWithKey(s.client, "http://"+s.usersAddr+"/users", seedKey, body, asSuite...)
	require.NoError(s.t, err)
	require.Equal(s.t, http.StatusCreated, status, "seed user: %s", answer)
	s.foreignKeys = append(s.foreignKeys, seedKey)

	others := s.startLoad(100, 2*time.Second)
	poison := s.startLoadOf([]personBody{{Name: "Poison Row", Email: "poison@example.com", DocumentNumber: poisonDoc}}, time.Millisecond)
	others.wait(time.Minute)
	poison.wait(time.Minute)
	s.expect.Dead = 1
	s.afterChecks = append(s.afterChecks, func(r invariant.Report) {
		ids := poison.ackedIDs()
		if len(ids) != 1 {
			s.violate("the poison student was not created")
			return
		}
		if r.ByClass[ids[0]] != invariant.Dead {
			s.violate("the poison student is %s, want dead", r.ByClass[ids[0]])
		}
		for why := range r.DeadReasons {
			if !strings.Contains(why, "409") || !strings.Contains(why, "Document number already in use") {
				s.violate("dead-letter reason %q does not say the document number is taken", why)
			}
		}
	})
}

// 10. Bursts of identical POST /users with one key each, sent at the same
// instant straight at Users: 4 waves of 5 keys, 20 requests per key. Users
// must create one user per key, give every request for a key the same
// answer, and act on exactly one of them (the others are replays).
func idempotentBursts(s *scenario) {
	const waves, keysPerWave, perKey = 4, 5, 20
	answered := 0
	for wave := range waves {
		var (
			mu      sync.Mutex
			answers = map[string][]userAnswer{}
			wg      sync.WaitGroup
			gate    = make(chan struct{})
		)
		for k := range keysPerWave {
			key := uuid.NewString()
			s.foreignKeys = append(s.foreignKeys, key)
			n := wave*keysPerWave + k
			body, _ := json.Marshal(personBody{Name: fmt.Sprintf("Burst %d", n), Email: fmt.Sprintf("burst-%d@example.com", n), DocumentNumber: fmt.Sprintf("S10-%03d", n)})
			for range perKey {
				wg.Go(func() {
					<-gate
					a, ok := s.postUserUntilAnswered(key, body)
					if ok {
						mu.Lock()
						answers[key] = append(answers[key], a)
						mu.Unlock()
					}
				})
			}
		}
		close(gate)
		wg.Wait()
		for key, as := range answers {
			answered += len(as)
			fresh := 0
			for _, a := range as {
				if !a.replayed {
					fresh++
				}
				if a.status != as[0].status || a.body != as[0].body {
					s.violate("key %s: answers differ: %d %s vs %d %s", key, as[0].status, as[0].body, a.status, a.body)
					break
				}
			}
			if as[0].status != http.StatusCreated {
				s.violate("key %s: answered %d %s, want 201", key, as[0].status, as[0].body)
			}
			if fresh != 1 {
				s.violate("key %s: %d answers were not replays, want exactly 1", key, fresh)
			}
			if len(as) != perKey {
				s.violate("key %s: %d of %d requests got an answer", key, len(as), perKey)
			}
		}
	}
	keys := waves * keysPerWave
	s.note("%d keys × %d identical concurrent requests: %d answers", keys, perKey, answered)
	s.afterChecks = append(s.afterChecks, func(r invariant.Report) {
		if r.Foreign != keys || r.Users != keys {
			s.violate("Users has %d users (%d under the burst keys), want %d", r.Users, r.Foreign, keys)
		}
		if want := answered - keys; r.Replays != want {
			s.violate("inbox replays = %d, want %d (every answer but the first per key)", r.Replays, want)
		}
	})
}

// userAnswer is one answer of Users to POST /users.
type userAnswer struct {
	status   int
	body     string
	replayed bool
}

// postUserUntilAnswered posts to Users directly, retrying only while the
// key is busy or Users fails, as a client of the protocol would.
func (s *scenario) postUserUntilAnswered(key string, body []byte) (userAnswer, bool) {
	deadline := time.Now().Add(time.Minute)
	for {
		status, got, replayed, err := postWithKey(s.client, "http://"+s.usersAddr+"/users", key, body, asSuite...)
		if err == nil && !retryableAnswer(status, got) {
			return userAnswer{status, string(got), replayed}, true
		}
		if time.Now().After(deadline) {
			return userAnswer{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The frozen-connection scenarios. A network path to PostgreSQL stops
// forwarding without closing (dbProxy.freeze) while a process holds still at
// a pause point inside a transaction or just before a statement, so that its
// connection is caught in exactly that state; after freezeHold (5s) the
// network heals. Connections caught in the freeze stay broken, as behind a
// NAT or firewall that forgot them: the client gives up, but neither its
// statements nor its goodbye ever reach the server. New connections work.
//
// Without limits the server keeps a caught session "idle in transaction",
// with its row locks, for hours, and a client without a deadline waits for
// an answer for ever. The limits of internal/database end such a session
// after 10s (idle_in_transaction_session_timeout) and bound every
// transaction and read on the client (database.WithDeadline), so the system
// must drain within drainBound (60s) of the heal: every student linked,
// nothing lost, nothing duplicated.

// 11. The sender holds still just before it sends a recording's one batch
// (PAUSE_POINT=sender-before-record@5). The network to Student's database
// freezes, and the batch goes into the freeze. The sender never waits for
// a round trip inside a transaction: the server gets a recording whole,
// its commit included, or not at all. So the freeze must leave no session
// of the sender inside a transaction holding the batch's rows; the sender
// records the same answers again once the network is back (or leaves the
// rows to their leases, and they are delivered again and replayed).
func frozenRecord(s *scenario) {
	l := s.startLoad(150, 5*time.Second)
	sender := s.newSender()
	s.startProc(sender, "PAUSE_POINT=sender-before-record@5")
	healed, caught, ok := s.freezeAtPause(sender, "sender-before-record", s.senderDBProxy, s.studentDB, true)
	if ok {
		s.drainAfterHeal(healed, s.studentDB, caught)
	}
	l.wait(time.Minute)
}

// 12. The sender holds still just before a claim
// (PAUSE_POINT=sender-before-claim@10); the network to Student's database
// freezes, and the claim (or the pool's ping before it) goes into it. A
// claim is one statement outside any transaction; its deadline
// (database.WithDeadline, SENDER_DATABASE_TIMEOUT) makes the sender abandon
// the caught connection and claim again on a new one once the network is
// back. The server session left behind is idle and holds no lock. Without
// the deadline the claimer would wait for the answer for ever. The
// recorders keep working while the claimer holds still, so the freeze may
// also catch one inside its recording transaction: the server must end that
// session, as in scenario 11.
func frozenClaim(s *scenario) {
	l := s.startLoad(150, 5*time.Second)
	time.Sleep(500 * time.Millisecond)
	sender := s.newSender()
	s.startProc(sender, "PAUSE_POINT=sender-before-claim@10")
	healed, caught, ok := s.freezeAtPause(sender, "sender-before-claim", s.senderDBProxy, s.studentDB, false)
	if ok {
		s.drainAfterHeal(healed, s.studentDB, caught)
	}
	l.wait(time.Minute)
}

// 13. Users holds still just before it sends a create-user's one batch,
// the key with its answer and the user (PAUSE_POINT=users-before-inbox@20).
// The network to Users' database freezes, and the batch goes into the
// freeze. Users never waits for a round trip inside a transaction: the
// server gets a transaction whole, its end included, or not at all. So the
// freeze must leave no session of Users inside a transaction, and no key
// locked; the sender's retry after the heal creates the user, once.
func frozenInbox(s *scenario) {
	l := s.startLoad(150, 5*time.Second)
	healed, caught, ok := s.freezeAtPause(s.users, "users-before-inbox", s.usersDBProxy, s.usersDB, true)
	if ok {
		s.drainAfterHeal(healed, s.usersDB, caught)
	}
	l.wait(time.Minute)
}
