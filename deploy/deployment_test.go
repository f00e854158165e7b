package deploy

// This file loads a compose file as Docker Compose would, with the
// Dockerfiles its services build, and lists the checks TestCompose runs on
// the result.

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const (
	composeFile = "../docker-compose.yml" // relative to this package's folder, where go test runs
	repoRoot    = ".."
	// The project name is fixed so the result does not depend on the folder
	// the repository was cloned into or on COMPOSE_PROJECT_NAME.
	composeProject = "outboxref"
	// Bounds the loader (the checks themselves are plain computation); it
	// takes milliseconds, so hitting this means something hangs.
	composeTimeout = 30 * time.Second
)

// check is one rule; it returns a line per problem found.
type check struct {
	name string
	run  func(d *deployment) []string
}

var checks = []check{
	{"required services", checkRequiredServices},
	{"image builds the binaries", checkBuild},
	{"environment", checkEnvironment},
	{"ports", checkPorts},
	{"database URLs", checkDatabases},
	{"database roles and secrets", checkRoleSecrets},
	{"service URLs", checkServiceURLs},
	{"start order", checkStartOrder},
	{"healthchecks", checkHealthchecks},
	{"depends_on conditions", checkDependsOnConditions},
	{"inbox outlasts sender retries", checkRetention},
	{"users answers before the sender gives up", checkWaitsNest},
	{"callers authenticate", checkCallers},
	{"observability profile", checkObservabilityProfile},
	{"traces reach the collector", checkTracing},
	{"prometheus scrapes the admin ports", checkScrapes},
	{"prometheus loads the alert rules", checkAlertRules},
	{"admin ports answer their callers' names", checkAdminHosts},
	{"grafana is provisioned", checkGrafana},
	{"sender source follows the host", checkSenderSource},
	{"database keeps WAL for a slot, within a bound", checkLogicalDecoding},
}

// hostEnvironments are the host environments the compose file is checked
// under: none, as plain `docker compose up` sees it, and the one the header
// of the file gives for the sender's cdc source. Each must be a deployment
// that passes every check.
var hostEnvironments = map[string]types.Mapping{
	"plain":             {},
	"SENDER_SOURCE=cdc": {"SENDER_SOURCE": "cdc"},
}

// deployment is a loaded compose project and the Dockerfiles it builds.
type deployment struct {
	project *types.Project
	images  map[string]image // by Dockerfile path
	errs    map[string]error // Dockerfiles that could not be read or parsed
	// secretVars maps, per service, each *_FILE variable that names a
	// secret mounted in the service to that secret.
	secretVars map[string]map[string]string
	// env is the host environment the file was loaded with: what its
	// ${VARIABLE} references were replaced from.
	env types.Mapping
}

// loadDeployment parses a compose file as Docker Compose would, except that
// variables come from env rather than the host environment or a .env
// file: the result must not depend on who runs the test.
func loadDeployment(t *testing.T, filename string, content []byte, env types.Mapping) *deployment {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), composeTimeout)
	defer cancel()
	abs, err := filepath.Abs(filename)
	require.NoError(t, err)
	project, err := loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs, Content: content}},
		Environment: env,
	}, func(o *loader.Options) {
		o.SetProjectName(composeProject, true)
		o.ResolvePaths = true // build contexts become absolute, so we can stat them
		// Every profile's services are checked: those of "observability"
		// too, and checkObservabilityProfile sees to it that the plain
		// `docker compose up` still gets the whole system.
		o.Profiles = []string{"*"}
	})
	require.NoError(t, err, "loading %s", filename)

	d := &deployment{project: project, env: env, images: map[string]image{}, errs: map[string]error{}}
	d.resolveSecrets()
	for _, s := range project.Services {
		if s.Build == nil {
			continue
		}
		file := dockerfilePath(s.Build)
		if _, done := d.images[file]; done || d.errs[file] != nil {
			continue
		}
		text, err := os.ReadFile(file)
		if err == nil {
			var img image
			if img, err = parseDockerfile(string(text)); err == nil {
				d.images[file] = img
				continue
			}
		}
		d.errs[file] = err
	}
	return d
}

// resolveSecrets points every *_FILE variable that names a secret mounted
// in its service (/run/secrets/<target>) at the secret's file on this
// host, so that the binaries' config loaders, which read those files, see
// what the container would; and it records which secret each names. A
// variable naming a path nothing is mounted at is left alone: the loader
// then fails to read it, and checkEnvironment says so.
func (d *deployment) resolveSecrets() {
	d.secretVars = map[string]map[string]string{}
	for name, s := range d.project.Services {
		d.secretVars[name] = map[string]string{}
		mounted := map[string]string{} // path in the container → secret
		for _, ref := range s.Secrets {
			target := cmp.Or(ref.Target, ref.Source)
			if !path.IsAbs(target) {
				target = path.Join("/run/secrets", target)
			}
			mounted[target] = ref.Source
		}
		for v, val := range s.Environment {
			if !strings.HasSuffix(v, "_FILE") || val == nil {
				continue
			}
			secret, ok := mounted[path.Clean(*val)]
			if !ok {
				continue
			}
			d.secretVars[name][v] = secret
			if cfg, ok := d.project.Secrets[secret]; ok && cfg.File != "" {
				file := cfg.File
				s.Environment[v] = &file
			}
		}
	}
}

func dockerfilePath(b *types.BuildConfig) string {
	f := b.Dockerfile
	if f == "" {
		f = "Dockerfile"
	}
	if !filepath.IsAbs(f) {
		f = filepath.Join(b.Context, f)
	}
	return f
}

// goServices are the services that run one of our binaries: those built
// from source, and the required ones even if they lost their build section.
// The broker's provisioning job runs the sender's binary but is none of
// the sender's deployments (no database, no port): nats_test.go checks it.
func (d *deployment) goServices() []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		s := d.project.Services[name]
		if isBrokerProvision(s) {
			continue
		}
		if s.Build != nil || len(requiredServices[name]) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// servingGoServices are the Go services that serve (not the migrations).
func (d *deployment) servingGoServices() []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, s := range d.goServices() {
		if _, _, ok := binaryOf(s); ok && !isMigration(s) {
			out = append(out, s)
		}
	}
	return out
}

// binaryOf returns the binary a service runs, judged by its command.
func binaryOf(s types.ServiceConfig) (string, binary, bool) {
	if len(s.Command) == 0 {
		return "", binary{}, false
	}
	name := path.Base(s.Command[0])
	b, ok := binaries[name]
	return name, b, ok
}

func isMigration(s types.ServiceConfig) bool {
	return len(s.Command) == 2 && s.Command[1] == "migrate"
}

// isBrokerProvision says whether a service is the one-shot job that makes
// the broker's streams and consumers (outbox-sender provision-broker): it
// serves nothing and touches no database.
func isBrokerProvision(s types.ServiceConfig) bool {
	return len(s.Command) == 2 && s.Command[0] == "outbox-sender" && s.Command[1] == "provision-broker"
}

// config runs the service's binary's LoadConfig on the service's
// environment.
func config(s types.ServiceConfig) (appConfig, error) {
	_, b, _ := binaryOf(s)
	return b.load(getenvOf(s.Environment))
}

// getenvOf reads a compose environment the way the container will see it.
// A variable listed without a value and absent from the (empty) host
// environment is unset in the container, hence "".
func getenvOf(env types.MappingWithEquals) func(string) string {
	return func(name string) string {
		if v := env[name]; v != nil {
			return *v
		}
		return ""
	}
}

// imageRepo is an image reference without its tag or digest.
func imageRepo(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}

// servicesOf returns the services that run image repo, in name order.
func (d *deployment) servicesOf(repo string) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		if s := d.project.Services[name]; imageRepo(s.Image) == repo {
			out = append(out, s)
		}
	}
	return out
}

// hostPath maps a path inside s's container to the host path the bind
// mount covering it puts there, or "" when no bind mount covers it.
func (d *deployment) hostPath(s types.ServiceConfig, inContainer string) string {
	var target, source string
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		t := path.Clean(v.Target)
		if (inContainer == t || strings.HasPrefix(inContainer, t+"/")) && len(t) > len(target) {
			target, source = t, v.Source
		}
	}
	if target == "" {
		return ""
	}
	if !filepath.IsAbs(source) {
		source = filepath.Join(d.project.WorkingDir, source)
	}
	return filepath.Join(source, filepath.FromSlash(strings.TrimPrefix(inContainer, target)))
}

// withoutLab rewrites a compose file as a deployment without the lab
// would have it: no lab service and no lab_reader secrets, and the sender
// calling Users directly.
func withoutLab(t *testing.T, content []byte) []byte {
	t.Helper()
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(content, &doc))
	services, _ := doc["services"].(map[string]any)
	require.Contains(t, services, "lab")
	delete(services, "lab")
	for name, svc := range services {
		svc, _ := svc.(map[string]any)
		if env, ok := svc["environment"].(map[string]any); ok {
			for v := range env {
				if strings.HasPrefix(v, "LAB_") {
					delete(env, v)
				}
			}
			if name == "outbox-sender" {
				env["SENDER_USERS_URL"] = "http://users:8081"
			}
		}
		if deps, ok := svc["depends_on"].(map[string]any); ok {
			delete(deps, "lab")
		}
		if secrets, ok := svc["secrets"].([]any); ok {
			svc["secrets"] = slices.DeleteFunc(secrets, func(s any) bool { return strings.HasPrefix(fmt.Sprint(s), "lab_") })
		}
	}
	secrets, _ := doc["secrets"].(map[string]any)
	for name := range secrets {
		if strings.HasPrefix(name, "lab_") {
			delete(secrets, name)
		}
	}
	out, err := yaml.Marshal(doc)
	require.NoError(t, err)
	require.NotContains(t, string(out), "lab")
	return out
}
