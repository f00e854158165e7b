//go:build e2e

package e2e

// TestLabInBrowser proves the fault lab the way a person uses it: a real,
// headless Chromium opens the lab's page, turns on answer drops, creates 100
// students, heals, and reads from the page that every student was linked
// once, none twice, and that the sender had to redeliver. The databases,
// read by the shared checker, must agree with what the page showed.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/invariant"
)

// chromiumPath is where Debian's chromium package puts the browser; CI
// (.ci/run) installs it from there.
const chromiumPath = "/usr/bin/chromium"

// labStudents is how many students the test creates through the page.
const labStudents = 100

// labScreenshotEnv, set to "update", makes the test write its screenshot to
// docs/lab.png, the README's image, and the checksums of the image and
// of the page it shows to docs/lab.sha256, which a test in docs/ holds
// the page to. CI never sets it, so no run writes into the tree by
// accident.
const labScreenshotEnv = "LAB_SCREENSHOT"

// labPageSource is the page the screenshot shows, from the repository root.
const labPageSource = "lab/faultlab/page/index.html"

// transitionsJS runs in the page before its own script: it notes each box
// of the flow and tile of the checker whose colour has run a transition,
// so that the test can tell a box that was green at once from one that
// faded in from white.
const transitionsJS = `window.labTransitions = [];
document.addEventListener("transitionrun", (ev) => {
  const el = ev.target;
  const name = el.dataset.hop || el.id;
  if (el.classList && (el.classList.contains("hop") || el.classList.contains("tile")) && !window.labTransitions.includes(name)) {
    window.labTransitions.push(name);
  }
}, true);`

// pageNumbers are the ids of the page's numbers, each holding only the
// number as text once the page has read /api/state.
var pageNumbers = []string{
	"students-total", "students-pending", "students-linked", "students-failed",
	"outbox-pending", "outbox-delivered", "outbox-dead", "attempts", "redeliveries",
	"users", "inbox", "replays", "own-users", "students-all",
	"check-lost", "check-duplicated", "check-mislinked", "check-unexpected",
}

// pageTexts are the other elements whose text the test reads and logs.
var pageTexts = []string{"updated", "errors", "create-msg", "drop-answers-msg", "heal-msg", "one-each-msg"}

// labSystem is what the test runs: Student, Users, one outbox sender whose
// Users is the lab's fault proxy, and the lab.
type labSystem struct {
	*scenario // the harness's databases, processes and logs folder
	lab       *proc
	sender    *proc
	labHTTP   string // the page and its API
}

func TestLabInBrowser(t *testing.T) {
	start := time.Now()
	// Before anything starts: without the browser there is nothing to test,
	// and a skip would let CI pass without it.
	if fi, err := os.Stat(chromiumPath); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("TestLabInBrowser needs Debian's chromium package at %s (%v): install it with `apt-get install chromium` (.ci/run does this in CI)", chromiumPath, err)
	}
	// The whole test, browser and processes, is bounded. Not t.Context()
	// itself, which ends before the cleanups run: on a failure, a cleanup
	// still reads the open page for the report. Registered first, so it
	// ends last.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 150*time.Second)
	t.Cleanup(cancel)

	sys := startLabSystem(newLabScenario(t, ctx))
	page := openLabPage(t, ctx, sys)

	// 1. The page loads and refreshes itself from /api/state.
	first := page.waitFor("the page shows a refresh", 20*time.Second, func(v pageView) bool { return v.refreshed() && v.num("students-total") == 0 })
	page.waitFor("the page refreshes again", 10*time.Second, func(v pageView) bool { return v.refreshed() && v["updated"] != first["updated"] })
	require.Empty(t, first["errors"], "the page shows errors before anything was broken")
	// The system was ready before the page opened: its boxes and tiles
	// take their colours with the first reading, none fading in.
	faded, err := chromedp.Run(page.ctx, chromedp.Evaluate[string](`JSON.stringify(window.labTransitions)`))
	require.NoError(t, err)
	require.Equal(t, "[]", faded, "a healthy box is green at once, at load: these faded in from white")

	// 2. Answer drops on.
	page.do("check #drop-answers", chromedp.Click(chromedp.ID("drop-answers")))
	page.waitFor("the page shows answers dropped", 10*time.Second, func(v pageView) bool {
		return v["drop-checked"] == "true" && strings.Contains(v["hop-lab"], "bad")
	})
	sys.requireFaults(t, ctx, `"drop_answers":true`)

	// 3. 100 students, created by the lab through Student's API.
	page.do("set #create-count", chromedp.SetValue(chromedp.ID("create-count"), strconv.Itoa(labStudents)))
	page.do("click #create", chromedp.Click(chromedp.ID("create")))
	page.waitFor(fmt.Sprintf("the page shows %d students", labStudents), 60*time.Second, func(v pageView) bool {
		return v.num("students-total") == labStudents
	})

	// 4. Drops happen: the sender redelivers students whose answer the lab
	// dropped, while they wait to be linked.
	page.waitFor("the page shows redeliveries while students are pending", 30*time.Second, func(v pageView) bool {
		return v.num("students-total") == labStudents && v.num("redeliveries") > 0 && v.num("students-pending") > 0
	})

	// 5. Heal.
	page.do("click #heal", chromedp.Click(chromedp.ID("heal")))
	healed := time.Now()
	page.waitFor("the page shows every fault off", 10*time.Second, func(v pageView) bool {
		return v["drop-checked"] == "false" && strings.Contains(v["hop-lab"], "ok")
	})

	// 6. Everything links, once.
	final := page.waitFor(fmt.Sprintf("the page shows %d students linked", labStudents), 60*time.Second, func(v pageView) bool {
		return v.num("students-linked") == labStudents
	})
	drain := time.Since(healed)
	t.Logf("every student linked %s after the heal", drain.Round(100*time.Millisecond))
	for id, want := range map[string]int{
		"students-total": labStudents, "students-linked": labStudents, "students-pending": 0, "students-failed": 0,
		"check-lost": 0, "check-duplicated": 0, "check-mislinked": 0, "check-unexpected": 0,
		"own-users": labStudents, "students-all": labStudents,
	} {
		require.Equal(t, want, final.num(id), "#%s on the page; the page showed %s", id, final)
	}
	require.Equal(t, "every student has exactly one user", final["one-each-msg"], "the tile says it plainly")
	require.Positive(t, final.num("redeliveries"), "#redeliveries on the page: the dropped answers must have been redelivered; the page showed %s", final)

	// 7. The picture of it.
	page.screenshot()

	// 8. The databases agree with the page.
	loadCtx, loadCancel := context.WithTimeout(ctx, 30*time.Second)
	defer loadCancel()
	st, err := invariant.Load(loadCtx, sys.studentURL, sys.usersURL)
	require.NoError(t, err, "the checker could not read the databases")
	rep := invariant.Classify(st, invariant.Input{Caller: senderCaller})
	t.Logf("the checker, from the databases:\n%s", rep.Table())
	violations := invariant.Violations(rep, invariant.Expect{})
	require.Equal(t, labStudents, rep.Students, "students in Student's database")
	require.Positive(t, rep.Redeliveries, "redeliveries in Student's outbox")
	// The page refreshes every 500 ms and the system is quiet: within a few
	// refreshes it shows what the databases hold.
	agree := func(shown pageView) []string {
		var diff []string
		for id, want := range map[string]int{
			"students-total": rep.Students, "students-linked": rep.Linked, "users": rep.Users,
			"redeliveries": rep.Redeliveries, "replays": rep.Replays,
			"check-lost": rep.Lost, "check-duplicated": rep.Duplicated,
			"check-mislinked": rep.Mislinked, "check-unexpected": rep.Unexpected,
		} {
			if got := shown.num(id); got != want {
				diff = append(diff, fmt.Sprintf("#%s shows %s, the databases have %d", id, shown[id], want))
			}
		}
		return diff
	}
	last := page.waitFor("the page agrees with the databases", 10*time.Second, func(v pageView) bool { return len(agree(v)) == 0 })
	violations = append(violations, agree(last)...)
	for _, p := range []*proc{sys.users, sys.student, sys.sender, sys.lab} {
		violations = append(violations, p.takeSurprises()...)
	}

	verdict := "ok"
	if len(violations) > 0 {
		verdict = fmt.Sprintf("FAIL (%d)", len(violations))
	}
	recordResult(scenarioResult{name: "lab-in-browser", source: sourcePoll, build: suite.good.label, verdict: verdict,
		duration: time.Since(start), drain: drain, report: rep})
	require.Empty(t, violations, "the databases or the processes disagree with a passing page")
	t.Logf("TestLabInBrowser passed in %s", time.Since(start).Round(100*time.Millisecond))
}

// newLabScenario is the scenario harness's frame for the lab: its own log
// directory, the good build, and ctx as the scenario's context.
func newLabScenario(t *testing.T, ctx context.Context) *scenario {
	t.Helper()
	bins := suite.good
	require.NotEmpty(t, bins.lab, "the suite did not build the lab")
	s := &scenario{t: t, def: scenarioDef{id: "lab-in-browser", title: "the fault lab's page in a browser"}, bins: bins, ctx: ctx}
	s.dir = filepath.Join(suite.e2eDir, "logs", "lab-in-browser-"+time.Now().Format("20060102-150405"))
	require.NoError(t, os.MkdirAll(s.dir, 0o755))
	// Registered first, so it runs last, after every process is dead.
	t.Cleanup(func() {
		switch {
		case t.Failed():
			t.Logf("TestLabInBrowser failed: its logs, the page's text, the lab's state and a screenshot are kept in %s", s.dir)
		case os.Getenv("E2E_KEEP_LOGS") != "":
			t.Logf("logs of TestLabInBrowser kept in %s (E2E_KEEP_LOGS)", s.dir)
		default:
			_ = os.RemoveAll(s.dir)
		}
	})
	return s
}

// startLabSystem creates and migrates the two databases and starts Users,
// Student, the lab and one sender that reaches Users through the lab's
// proxy. It reuses the scenario harness's pieces, without a scenario's
// Toxiproxy and senders; everything is bounded by s.ctx.
func startLabSystem(s *scenario) *labSystem {
	t := s.t
	t.Helper()
	start := time.Now()
	bins := s.bins

	// lab_reader gets its login from migrate, as in compose.
	labSecret := roleSecret(t, migrations.LabReader)
	s.studentURL = s.createDatabase(suite.student, "student")
	s.usersURL = s.createDatabase(suite.users, "users")
	s.migrate(bins.student, "STUDENT_MIGRATE_DATABASE_URL="+s.studentURL,
		"STUDENT_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.StudentApp),
		"SENDER_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.OutboxSender),
		"SENDER_CDC_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.OutboxCDC),
		"LAB_STUDENT_DATABASE_PASSWORD_FILE="+labSecret)
	s.migrate(bins.users, "USERS_MIGRATE_DATABASE_URL="+s.usersURL,
		"USERS_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.UsersApp),
		"LAB_USERS_DATABASE_PASSWORD_FILE="+labSecret)

	s.usersAddr, s.usersAdmin = apitest.FreeAddr(t), apitest.FreeAddr(t)
	s.users = s.newProc("users", bins.users, "http://"+s.usersAddr+"/readyz",
		"USERS_HTTP_ADDR="+s.usersAddr, "USERS_ADMIN_ADDR="+s.usersAdmin, "USERS_INBOX_RETENTION=168h", "LOG_LEVEL=info",
		"USERS_DATABASE_URL="+asRole(t, s.usersURL, migrations.UsersApp),
		"USERS_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.UsersApp),
		"USERS_API_TOKENS="+usersTokens)
	s.startProc(s.users)
	s.studentAddr, s.studentAdmin = apitest.FreeAddr(t), apitest.FreeAddr(t)
	s.student = s.newProc("student", bins.student, "http://"+s.studentAddr+"/readyz",
		"STUDENT_HTTP_ADDR="+s.studentAddr, "STUDENT_ADMIN_ADDR="+s.studentAdmin, "LOG_LEVEL=info",
		"STUDENT_DATABASE_URL="+asRole(t, s.studentURL, migrations.StudentApp),
		"STUDENT_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.StudentApp), "STUDENT_API_TOKENS="+studentTokens)
	s.startProc(s.student)

	sys := &labSystem{scenario: s}
	labProxy, senderAdmin := apitest.FreeAddr(t), apitest.FreeAddr(t)
	sys.labHTTP = apitest.FreeAddr(t)
	sys.lab = s.newProc("lab", bins.lab, "http://"+sys.labHTTP+"/readyz",
		"LAB_HTTP_ADDR="+sys.labHTTP, "LAB_PROXY_ADDR="+labProxy, "LOG_LEVEL=info",
		"LAB_USERS_URL=http://"+s.usersAddr, "LAB_STUDENT_URL=http://"+s.studentAddr, "LAB_STUDENT_TOKEN="+labStudentToken,
		"LAB_STUDENT_ADMIN_URL=http://"+s.studentAdmin, "LAB_USERS_ADMIN_URL=http://"+s.usersAdmin,
		"LAB_SENDER_ADMIN_URL=http://"+senderAdmin, "LAB_SENDER_ADMIN_TOKEN="+labStudentToken,
		"LAB_STUDENT_DATABASE_URL="+asRole(t, s.studentURL, migrations.LabReader),
		"LAB_STUDENT_DATABASE_PASSWORD_FILE="+labSecret,
		"LAB_USERS_DATABASE_URL="+asRole(t, s.usersURL, migrations.LabReader),
		"LAB_USERS_DATABASE_PASSWORD_FILE="+labSecret)
	// The suite's sender settings (newSenderOf): fast polls, a 1 s request
	// timeout and backoffs of at most 1 s, so that every student links
	// within seconds of the heal; attempts effectively unlimited, so that
	// dropped answers never dead-letter a row.
	sys.sender = s.newProc("sender-1", bins.sender, "http://"+senderAdmin+"/readyz", append([]string{
		"SENDER_DATABASE_URL=" + asRole(t, s.studentURL, migrations.OutboxSender),
		"SENDER_DATABASE_PASSWORD_FILE=" + roleSecret(t, migrations.OutboxSender),
		"SENDER_USERS_URL=http://" + labProxy,
		"SENDER_ADMIN_ADDR=" + senderAdmin,
		"SENDER_ID=sender-1",
		"SENDER_USERS_TOKEN=" + senderToken,
		"SENDER_ADMIN_TOKENS=lab:" + labStudentToken,
		"LOG_LEVEL=info",
	}, senderTuning...)...)
	s.senders = []*proc{sys.sender}
	// The lab watches the sender and the sender sends through the lab:
	// both start, then both must become ready.
	require.NoError(t, sys.lab.start())
	require.NoError(t, sys.sender.start())
	require.NoError(t, sys.lab.waitReady(20*time.Second))
	require.NoError(t, sys.sender.waitReady(20*time.Second))
	t.Logf("system up in %s: lab page http://%s, proxy %s; logs in %s", time.Since(start).Round(100*time.Millisecond), sys.labHTTP, labProxy, s.dir)
	return sys
}

// state reads the lab's /api/state as raw JSON, for a failure's report.
func (sys *labSystem) state(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+sys.labHTTP+"/api/state", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET /api/state: %s", resp.Status)
	}
	var indented bytes.Buffer
	if json.Indent(&indented, b, "", "  ") != nil {
		return string(b), nil
	}
	return indented.String(), nil
}

// requireFaults checks the lab's own state, beside the page: the click
// reached the backend, not only the checkbox.
func (sys *labSystem) requireFaults(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	st, err := sys.state(ctx)
	require.NoError(t, err)
	var got struct {
		Faults json.RawMessage `json:"faults"`
	}
	require.NoError(t, json.Unmarshal([]byte(st), &got))
	compact := strings.NewReplacer(" ", "", "\n", "").Replace(string(got.Faults))
	require.Contains(t, compact, want, "the lab's faults after the click")
}

// labPage is the lab's page open in a headless Chromium.
type labPage struct {
	t   *testing.T
	ctx context.Context // the browser tab
	sys *labSystem

	mu         sync.Mutex
	exceptions []string // uncaught JavaScript exceptions on the page
}

// openLabPage starts Chromium, opens the page and makes sure that the
// browser is gone when the test ends.
func openLabPage(t *testing.T, ctx context.Context, sys *labSystem) *labPage {
	t.Helper()
	profile := t.TempDir() // registered before the browser's cleanup: removed after it
	chromiumLog, err := os.Create(filepath.Join(sys.dir, "chromium.log"))
	require.NoError(t, err)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		// This machine's network is closed: nothing may try to reach out.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		// A container's /dev/shm is often 64 MB, which Chromium can fill.
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 1000),
		chromedp.CombinedOutput(chromiumLog),
	}
	allocCtx, allocCancel := chromedp.NewExecAllocator(ctx, opts...)
	tab, tabCancel := chromedp.NewContext(allocCtx)
	// A timeout or an interrupt skips t.Cleanup; the suite's guard still
	// runs its cleanups (and the browser carries Pdeathsig).
	addCleanup(allocCancel)
	t.Cleanup(func() {
		closeCtx, cancel := context.WithTimeout(tab, 10*time.Second)
		defer cancel()
		if err := chromedp.Cancel(closeCtx); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("closing Chromium: %v", err)
		}
		tabCancel()
		allocCancel() // kills what is left, and waits for it
		chromiumLog.Close()
		if left := processesUsing(profile, 5*time.Second); len(left) > 0 {
			t.Errorf("Chromium processes still running after the browser was closed: %v", left)
		} else {
			t.Logf("Chromium closed: no process left with its profile %s", profile)
		}
	})

	p := &labPage{t: t, ctx: tab, sys: sys}
	// Subscribe before the navigation, so that no exception is missed.
	exceptions := chromedp.Events(tab, runtime.ExceptionThrown)
	go func() {
		for ev, err := range exceptions {
			if err != nil {
				return
			}
			p.mu.Lock()
			p.exceptions = append(p.exceptions, exceptionText(ev.ExceptionDetails))
			p.mu.Unlock()
		}
	}()
	// Runs before the browser's cleanup (cleanups run last first), while
	// the page is still open.
	t.Cleanup(p.afterTest)

	navCtx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	_, err = chromedp.Call(navCtx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: transitionsJS})
	require.NoError(t, err, "Chromium could not take the script that notes transitions; see %s", chromiumLog.Name())
	require.NoError(t, chromedp.Do(navCtx, chromedp.Navigate("http://"+sys.labHTTP+"/")), "Chromium could not open the lab's page; see %s", chromiumLog.Name())
	t.Logf("Chromium opened http://%s/", sys.labHTTP)
	return p
}

func exceptionText(d *runtime.ExceptionDetails) string {
	if d == nil {
		return "(no details)"
	}
	s := d.Text
	if d.Exception != nil && d.Exception.Description != "" {
		s += " " + d.Exception.Description
	}
	return fmt.Sprintf("%s (line %d, column %d)", s, d.LineNumber+1, d.ColumnNumber+1)
}

// afterTest reports what the page threw, and on a failure keeps what the
// page showed, the lab's state and a screenshot, with the processes' logs.
func (p *labPage) afterTest() {
	t := p.t
	p.mu.Lock()
	exceptions := p.exceptions
	p.mu.Unlock()
	if len(exceptions) > 0 {
		t.Errorf("the page threw %d uncaught JavaScript exceptions; first: %s", len(exceptions), exceptions[0])
	}
	if !t.Failed() {
		return
	}
	// The test's context may be spent: give the report its own seconds.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), 10*time.Second)
	defer cancel()
	if text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`)); err == nil {
		_ = os.WriteFile(filepath.Join(p.sys.dir, "page.txt"), []byte(text), 0o644)
		t.Logf("the page's text at the failure (all of it in page.txt):\n%s", head(text, 60))
	} else {
		t.Logf("could not read the page's text: %v", err)
	}
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		_ = os.WriteFile(filepath.Join(p.sys.dir, "page-at-failure.png"), png, 0o644)
	}
	if st, err := p.sys.state(ctx); err == nil {
		_ = os.WriteFile(filepath.Join(p.sys.dir, "state.json"), []byte(st), 0o644)
		t.Logf("the lab's /api/state at the failure (with its deliveries in state.json):\n%s", stateSummary(st))
	} else {
		t.Logf("could not read the lab's /api/state: %v %s", err, st)
	}
	t.Logf("the lab's log ends:\n%s", tail(p.sys.lab.logPath, 40))
}

// head is the first n lines of s.
func head(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("... (%d more lines)", len(lines)-n))
	}
	return strings.Join(lines, "\n")
}

// stateSummary is the lab's state JSON one field a line, without the
// deliveries, which fill a screen.
func stateSummary(st string) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal([]byte(st), &fields) != nil {
		return st
	}
	var b strings.Builder
	for _, k := range []string{"time", "hops", "counts", "checker", "problems", "faults", "proxy", "errors"} {
		var compact bytes.Buffer
		if json.Compact(&compact, fields[k]) == nil {
			fmt.Fprintf(&b, "%s: %s\n", k, compact.String())
		}
	}
	return b.String()
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// do runs one user action on the page, bounded.
func (p *labPage) do(what string, a chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	require.NoError(p.t, chromedp.Do(ctx, a), "%s", what)
	p.t.Logf("page: %s", what)
}

// pageView is what the page shows: the text of each number and message by
// its id, the lab hop's classes (hop-lab) and whether the drop checkbox is
// checked (drop-checked).
type pageView map[string]string

// snapshotJS reads every element the test looks at in one evaluation, so
// that the numbers come from one refresh.
var snapshotJS = func() string {
	ids, _ := json.Marshal(slices.Concat(pageNumbers, pageTexts))
	return `(() => {
  const out = {};
  for (const id of ` + string(ids) + `) {
    const el = document.getElementById(id);
    out[id] = el ? el.textContent.trim() : "(missing #" + id + ")";
  }
  const hop = document.querySelector('#flow [data-hop="lab"]');
  out["hop-lab"] = hop ? hop.className : "(missing)";
  const drop = document.getElementById("drop-answers");
  out["drop-checked"] = drop ? String(drop.checked) : "(missing)";
  return out;
})()`
}()

func (p *labPage) read() (pageView, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[pageView](snapshotJS))
}

// num is the number an element shows, or -1 while it shows none (the
// page's "–" before its first refresh, or anything that is not a number).
func (v pageView) num(id string) int {
	n, err := strconv.Atoi(v[id])
	if err != nil {
		return -1
	}
	return n
}

// refreshed reports whether the page has read /api/state at least once.
func (v pageView) refreshed() bool {
	return v["updated"] != "" && v["updated"] != "never"
}

func (v pageView) String() string {
	return fmt.Sprintf("students total=%s pending=%s linked=%s failed=%s | outbox pending=%s delivered=%s dead=%s | attempts=%s redeliveries=%s | users=%s inbox=%s replays=%s | checker lost=%s duplicated=%s mislinked=%s unexpected=%s | lab hop %q, drop checked=%s | updated %s, errors %q, create %q, drop %q, heal %q",
		v["students-total"], v["students-pending"], v["students-linked"], v["students-failed"],
		v["outbox-pending"], v["outbox-delivered"], v["outbox-dead"], v["attempts"], v["redeliveries"],
		v["users"], v["inbox"], v["replays"],
		v["check-lost"], v["check-duplicated"], v["check-mislinked"], v["check-unexpected"],
		v["hop-lab"], v["drop-checked"], v["updated"], v["errors"], v["create-msg"], v["drop-answers-msg"], v["heal-msg"])
}

// waitFor polls the page until cond holds, logging what it shows, and
// fails the test if it does not within timeout.
func (p *labPage) waitFor(what string, timeout time.Duration, cond func(pageView) bool) pageView {
	p.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var last pageView
	var lastErr error
	lastLog := start
	for {
		v, err := p.read()
		if err == nil {
			last, lastErr = v, nil
			if cond(v) {
				p.t.Logf("page after %s, %s: %s", time.Since(start).Round(100*time.Millisecond), what, v)
				return v
			}
		} else {
			lastErr = err
		}
		if time.Since(lastLog) >= 5*time.Second {
			p.t.Logf("page while waiting until %s: %s", what, last)
			lastLog = time.Now()
		}
		if time.Now().After(deadline) || p.ctx.Err() != nil {
			p.t.Fatalf("timed out after %s waiting until %s; the page showed: %s (last read error: %v)", timeout, what, last, lastErr)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// screenshot takes a full-page PNG into the test's temporary folder and the
// logs folder, and into docs/lab.png when LAB_SCREENSHOT=update, with
// docs/lab.sha256.
//
// The quality is 100 because chromedp takes a JPEG at any other quality,
// and docs/lab.png must be a PNG.
func (p *labPage) screenshot() {
	t := p.t
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	// A box that has just changed colour (the lab's, at the heal) fades
	// for a moment: the picture waits until nothing on the page moves.
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](`document.getAnimations().length === 0`, chromedp.WithPollingTimeout(10*time.Second)))
	require.NoError(t, err, "the page was still fading 10 s after the test's last step")
	img, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "full-page screenshot")
	cfg, err := png.DecodeConfig(bytes.NewReader(img))
	require.NoError(t, err, "the screenshot is not a PNG")
	paths := []string{filepath.Join(t.TempDir(), "lab.png"), filepath.Join(p.sys.dir, "lab.png")}
	if os.Getenv(labScreenshotEnv) == "update" {
		paths = append(paths, filepath.Join(suite.root, "docs", "lab.png"))
	}
	for _, path := range paths {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, img, 0o644))
	}
	if os.Getenv(labScreenshotEnv) == "update" {
		// The page the binary embedded: the suite built it from this tree.
		source, err := os.ReadFile(filepath.Join(suite.root, labPageSource))
		require.NoError(t, err)
		// As sha256sum writes them, so that `sha256sum -c docs/lab.sha256`
		// checks them too, from the repository root.
		sums := fmt.Sprintf("%x  docs/lab.png\n%x  %s\n", sha256.Sum256(img), sha256.Sum256(source), labPageSource)
		require.NoError(t, os.WriteFile(filepath.Join(suite.root, "docs", "lab.sha256"), []byte(sums), 0o644))
	}
	t.Logf("screenshot %dx%d, %d KiB, written to %s", cfg.Width, cfg.Height, len(img)/1024, strings.Join(paths, ", "))
}

// processesUsing lists the processes that still have the browser profile
// dir on their command line (Chromium passes it to every child), waiting up
// to timeout for them to go. It asks pgrep, and reads /proc where there is
// no pgrep.
func processesUsing(dir string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		left := findProcesses(dir)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func findProcesses(pattern string) []string {
	if _, err := exec.LookPath("pgrep"); err == nil {
		out, err := exec.Command("pgrep", "-a", "-f", pattern).Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 1 {
			return nil // pgrep found nothing
		}
		if err == nil {
			return strings.Split(strings.TrimSpace(string(out)), "\n")
		}
	}
	entries, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == strconv.Itoa(os.Getpid()) {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(pattern)) {
			found = append(found, e.Name()+" "+string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
	}
	return found
}
