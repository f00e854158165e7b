package main

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	module = "github.com/outboxref/outboxref/"
	self   = module + "outbox-sender/"
)

// allowed is each of the sender's packages, with the sender's packages it
// may import. Imports run one way, from the top of this list to the
// bottom: the engine knows its seams and nothing behind them, the sources
// and the transports plug into the engine (side by side: neither
// transport imports the other, and both judge Users' answers by answer),
// the operator's tools and everything else stand on the store, and only
// the binary's wiring knows every part.
var allowed = map[string][]string{
	".":                 {"sender"},
	"sender":            {"relay", "poll", "cdc", "usershttp", "usersnats", "deadletter", "internal/store"},
	"cdc":               {"relay", "poll", "internal/store"},
	"poll":              {"relay", "internal/store"},
	"usersnats":         {"relay", "answer", "internal/store"},
	"usershttp":         {"relay", "answer", "internal/store"},
	"answer":            {"relay"},
	"deadletter":        {"internal/store"},
	"relay":             {"internal/store"},
	"internal/store":    {"internal/outboxdb"},
	"internal/outboxdb": {},
}

// The seams, which TestSeamsHold holds to the whole import graph below
// the sender's packages, the module's own packages (internal/...) and
// their imports of other modules included.
var (
	// engine is the delivery engine: it and any package under it know a
	// transport through relay.Transport only, and no broker at all.
	engine = "relay"
	// transports carry a row to Users. None reaches another.
	transports = []string{"usershttp", "usersnats"}
	// brokerTransport is the one transport that knows the broker.
	brokerTransport = "usersnats"
	// wiring puts the parts together: it alone picks a transport, and it
	// provisions the broker's streams and reads SENDER_NATS_*.
	wiring = []string{".", "sender"}
	// brokers are the broker's packages: NATS's own, and the module's
	// layer over them; each names itself and the packages under it.
	brokers = []string{"github.com/nats-io", module + "internal/natsbus"}
)

// TestImportsRunOneWay reads the import lines of every package under
// outbox-sender (tests aside) and holds them to allowed.
func TestImportsRunOneWay(t *testing.T) {
	t.Parallel()
	found := map[string]bool{}
	for _, path := range senderPackages(t) {
		found[path] = true
		require.Empty(t, forbidden(path, packageImports(t, path)), "outbox-sender/%s imports against the one-way rule", path)
	}
	for pkg := range allowed {
		require.True(t, found[pkg], "allowed names %s, which has no Go files: keep the list in step with the folders", pkg)
	}
	for pkg := range found {
		_, ok := allowed[pkg]
		require.True(t, ok, "outbox-sender/%s is a package the one-way rule does not know: add it to allowed", pkg)
	}
}

// TestSeamsHold follows the imports of every package of the sender
// through the module's own packages, and holds what each reaches to the
// seams: the engine reaches no transport and no broker package, no
// transport reaches another, and only the broker transport and the
// wiring reach the broker.
func TestSeamsHold(t *testing.T) {
	t.Parallel()
	graph := moduleGraph(t, "..")
	require.Contains(t, graph, module+"internal/natsbus", "the graph must reach the module's own packages")
	require.Contains(t, graph[self+brokerTransport], module+"internal/natsbus", "the graph must see the broker transport's imports")
	bad := seamBreaches(graph)
	require.Emptyf(t, bad, "a package of the sender reaches past a seam:\n%s", strings.Join(bad, "\n"))
}

// TestImportRulesCatchMistakes proves the checks above can fail: the
// engine importing a source, a transport or the broker, a source the
// transport, one transport another.
func TestImportRulesCatchMistakes(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"poll"}, forbidden("relay", []string{self + "poll", self + "internal/store", "context"}))
	require.Equal(t, []string{"usershttp"}, forbidden("cdc", []string{self + "usershttp", self + "relay"}))
	require.Equal(t, []string{"usershttp"}, forbidden("usersnats", []string{self + "usershttp", self + "answer"}))
	require.Empty(t, forbidden("sender", []string{self + "cdc", module + "internal/outbox"}))

	// Every kind of breach, direct and through the module's packages. A
	// breach is told by the package nearest it on its chain (the engine's
	// import of the broker, not each package above the engine), and a
	// chain only up to its first crossing (poll of usersnats, not of the
	// broker behind it); the wiring and the broker transport breach
	// nothing.
	natsbus, nats := module+"internal/natsbus", "github.com/nats-io/nats.go/jetstream"
	wake := module + "internal/outboxwake"
	graph := map[string][]string{
		self + "relay":          {self + "internal/store", natsbus, "context"},
		self + "relay/batch":    {nats},
		self + "internal/store": {natsbus},
		self + "usersnats":      {self + "relay", self + "answer", self + "usershttp", natsbus, nats},
		self + "usershttp":      {self + "relay", self + "answer"},
		self + "answer":         {self + "relay"},
		self + "sender":         {self + "usersnats", self + "usershttp", natsbus},
		self + "poll":           {self + "usersnats"},
		self + "cdc":            {wake},
		wake:                    {natsbus},
		natsbus:                 {nats},
	}
	require.Equal(t, []string{
		"outbox-sender/cdc reaches internal/natsbus (outbox-sender/cdc → internal/outboxwake → internal/natsbus): " + notBroker,
		"outbox-sender/internal/store reaches internal/natsbus (outbox-sender/internal/store → internal/natsbus): " + notBroker,
		"outbox-sender/poll reaches outbox-sender/usersnats (outbox-sender/poll → outbox-sender/usersnats): " + notPicking,
		"outbox-sender/relay reaches internal/natsbus (outbox-sender/relay → internal/natsbus): " + engineNoBroker,
		"outbox-sender/relay/batch reaches github.com/nats-io/nats.go/jetstream (outbox-sender/relay/batch → github.com/nats-io/nats.go/jetstream): " + engineNoBroker,
		"outbox-sender/usersnats reaches outbox-sender/usershttp (outbox-sender/usersnats → outbox-sender/usershttp): " + noTransportToTransport,
	}, seamBreaches(graph))

	// The engine importing a transport: told once, by the engine, not by
	// each package that reaches the transport through it.
	graph[self+"relay"] = []string{self + "usershttp"}
	graph[self+"internal/store"] = nil
	graph[self+"usersnats"] = []string{self + "relay", self + "answer", natsbus, nats}
	for _, gone := range []string{"relay/batch", "poll", "cdc"} {
		delete(graph, self+gone)
	}
	require.Equal(t, []string{
		"outbox-sender/relay reaches outbox-sender/usershttp (outbox-sender/relay → outbox-sender/usershttp): " + engineNoTransport,
	}, seamBreaches(graph))

	graph[self+"relay"] = nil
	require.Empty(t, seamBreaches(graph), "the wiring and the broker transport may reach the broker, and the wiring every transport")
}

// forbidden returns the sender's packages among imports that pkg may not
// import. Packages outside the sender are not its concern.
func forbidden(pkg string, imports []string) []string {
	var bad []string
	for _, imp := range imports {
		rel, ok := strings.CutPrefix(imp, self)
		if ok && !slices.Contains(allowed[pkg], rel) {
			bad = append(bad, rel)
		}
	}
	return bad
}

// Why each seam holds, as seamBreaches says it.
const (
	engineNoTransport      = "the engine must import no transport; it knows them through relay.Transport only"
	engineNoBroker         = "the engine must import no broker package; the broker stays behind its transport (usersnats)"
	noTransportToTransport = "no transport may import another; what both need belongs in a neutral package (such as answer)"
	notPicking             = "only the wiring (sender) picks a transport"
	notBroker              = "only the broker transport (usersnats) and the wiring (sender) may know the broker"
)

// seamBreaches says, sorted, where a package of the sender in graph
// (import path → imports) reaches past a seam, through any chain of the
// module's packages in graph, and by which chain. Each breach is told by
// the package nearest it: one that reaches it only through another
// package of the sender that breaches too leaves the telling to that one.
func seamBreaches(graph map[string][]string) []string {
	var bad []string
	for pkg := range graph {
		name, ok := senderPackage(pkg)
		if !ok || slices.Contains(wiring, name) {
			continue
		}
		crosses := func(dep string) bool { return crossing(name, dep) != "" }
		for dep, chain := range reach(graph, pkg, crosses) {
			why := crossing(name, dep)
			if why == "" || slices.ContainsFunc(chain[1:len(chain)-1], func(via string) bool { return breaches(via, dep) }) {
				continue // none, or one a package nearer dep tells
			}
			bad = append(bad, fmt.Sprintf("%s reaches %s (%s): %s", short(pkg), short(dep), strings.Join(mapSlice(chain, short), " → "), why))
		}
	}
	slices.Sort(bad)
	return bad
}

// breaches says whether pkg, an import path, is one of the sender's
// packages other than the wiring, and crosses a seam by reaching dep.
func breaches(pkg, dep string) bool {
	name, ok := senderPackage(pkg)
	return ok && !slices.Contains(wiring, name) && crossing(name, dep) != ""
}

// crossing says which seam the sender's package pkg (not the wiring)
// crosses by reaching dep, an import path; "" when none.
func crossing(pkg, dep string) string {
	inEngine := under(pkg, engine)
	if to, ok := senderPackage(dep); ok {
		for _, tr := range transports {
			if !under(to, tr) || under(pkg, tr) {
				continue
			}
			switch {
			case inEngine:
				return engineNoTransport
			case slices.ContainsFunc(transports, func(from string) bool { return under(pkg, from) }):
				return noTransportToTransport
			default:
				return notPicking
			}
		}
	}
	if slices.ContainsFunc(brokers, func(b string) bool { return under(dep, b) }) && !under(pkg, brokerTransport) {
		if inEngine {
			return engineNoBroker
		}
		return notBroker
	}
	return ""
}

// reach returns what pkg imports, directly or through the packages of
// graph, each with the shortest chain of imports from pkg to it. It goes
// no further than a package stop says so of: past the first seam a chain
// crosses, what else it reaches says nothing new.
func reach(graph map[string][]string, pkg string, stop func(string) bool) map[string][]string {
	chains := map[string][]string{pkg: {pkg}}
	for queue := []string{pkg}; len(queue) > 0; queue = queue[1:] {
		from := queue[0]
		for _, imp := range graph[from] {
			if _, seen := chains[imp]; seen {
				continue
			}
			chains[imp] = append(slices.Clone(chains[from]), imp)
			if _, ok := graph[imp]; ok && !stop(imp) {
				queue = append(queue, imp)
			}
		}
	}
	delete(chains, pkg)
	return chains
}

// moduleGraph reads the imports (tests aside) of the sender's packages
// and of every package of the module they reach, the module's root being
// root: import path → imports.
func moduleGraph(t *testing.T, root string) map[string][]string {
	t.Helper()
	graph := map[string][]string{}
	var visit func(pkg string)
	visit = func(pkg string) {
		if _, seen := graph[pkg]; seen {
			return
		}
		imports := packageImports(t, filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(pkg, module))))
		require.NotNil(t, imports, "%s has no Go files under %s", pkg, root)
		graph[pkg] = imports
		for _, imp := range imports {
			if strings.HasPrefix(imp, module) {
				visit(imp)
			}
		}
	}
	for _, path := range senderPackages(t) {
		visit(filepath.ToSlash(filepath.Join(self, path)))
	}
	return graph
}

// senderPackage returns the sender's name for an import path ("." for
// the binary, "relay" for outbox-sender/relay), and whether it is one of
// the sender's.
func senderPackage(imp string) (string, bool) {
	if imp+"/" == self {
		return ".", true
	}
	return strings.CutPrefix(imp, self)
}

// under says whether path is prefix or a package under it.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// short is an import path as messages say it: the module's packages by
// their folder.
func short(imp string) string {
	if rel, ok := strings.CutPrefix(imp, module); ok {
		return rel
	}
	return imp
}

func mapSlice(s []string, f func(string) string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = f(v)
	}
	return out
}

// senderPackages returns the folders under outbox-sender that hold a
// package ("." for the binary).
func senderPackages(t *testing.T) []string {
	t.Helper()
	var pkgs []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if packageImports(t, path) != nil {
			pkgs = append(pkgs, filepath.ToSlash(path))
		}
		return nil
	})
	require.NoError(t, err)
	return pkgs
}

// packageImports returns the imports of the non-test Go files in dir; nil
// when it has none. Files of every build tag count.
func packageImports(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	var imports []string
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			imports = append(imports, path)
		}
		if imports == nil {
			imports = []string{}
		}
	}
	return imports
}
