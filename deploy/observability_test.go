package deploy

// This file checks the compose profile "observability": which services run
// with it, the traces the Go services send to its Jaeger, and the targets
// its Prometheus scrapes.

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// observabilityProfile is the compose profile that adds what watches the
// system; observabilityServices are its services, by the image each runs.
const observabilityProfile = "observability"

var observabilityServices = map[string]string{
	"jaeger":     "jaegertracing/all-in-one",
	"prometheus": "prom/prometheus",
	"grafana":    "grafana/grafana",
}

// The ports the profile's services listen on inside the compose network:
// Jaeger's OTLP/HTTP receiver (4317 is its OTLP/gRPC one) and Prometheus'
// API, which Grafana queries.
const (
	otlpHTTPPort   = "4318"
	otlpGRPCPort   = "4317"
	prometheusPort = "9090"
)

// checkObservabilityProfile: Jaeger, Prometheus and Grafana run with the
// profile only, and everything else without a profile, so that plain
// `docker compose up` is the whole system and no more. Nothing outside the
// profile may wait for a service in it, or plain `up` would fail. Each UI
// is published on the loopback interface only: none has authentication
// set up.
func checkObservabilityProfile(d *deployment) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(observabilityServices)) {
		s, ok := d.project.Services[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("service %q is missing: the %s profile needs it", name, observabilityProfile))
			continue
		}
		if !slices.Equal(s.Profiles, []string{observabilityProfile}) {
			problems = append(problems, fmt.Sprintf("%q: has profiles %q, want only [%s]: it belongs to the profile, not to plain `docker compose up`", name, s.Profiles, observabilityProfile))
		}
		if want := observabilityServices[name]; imageRepo(s.Image) != want {
			problems = append(problems, fmt.Sprintf("%q: runs image %q, want %s", name, s.Image, want))
		}
		for _, p := range s.Ports {
			if !loopback(p.HostIP) {
				problems = append(problems, fmt.Sprintf("%q: publishes port %d on every interface, and it has no authentication set up: publish it on 127.0.0.1", name, p.Target))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		s := d.project.Services[name]
		if _, ok := observabilityServices[name]; ok {
			continue
		}
		if len(s.Profiles) > 0 {
			problems = append(problems, fmt.Sprintf("%q: has profiles %q, so plain `docker compose up` would leave it out", name, s.Profiles))
			continue
		}
		for _, dep := range slices.Sorted(maps.Keys(s.DependsOn)) {
			if p := d.project.Services[dep].Profiles; len(p) > 0 {
				problems = append(problems, fmt.Sprintf("%q: depends on %q, which runs only with profile %q: plain `docker compose up` would fail", name, dep, p))
			}
		}
	}
	return problems
}

// checkTracing: every serving Go service whose binary exports spans
// (binary.traces) exports them to the profile's Jaeger, over OTLP/HTTP
// (the exporter the binaries have), and services running different
// binaries have different names, so that one trace shows the three
// processes apart. Without the profile the exports fail, which the
// services log and otherwise ignore. The lab exports none; checkEnvironment
// refuses OTEL_ variables there, which would do nothing.
func checkTracing(d *deployment) []string {
	var problems []string
	named := map[string]string{} // OTEL_SERVICE_NAME → the binary using it
	for _, s := range d.servingGoServices() {
		bin, b, _ := binaryOf(s)
		if !b.traces {
			continue
		}
		env := getenvOf(s.Environment)
		endpointVar := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
		if env(endpointVar) == "" {
			endpointVar = "OTEL_EXPORTER_OTLP_ENDPOINT"
		}
		switch endpoint := env(endpointVar); {
		case endpoint == "" || env("OTEL_SDK_DISABLED") == "true":
			problems = append(problems, fmt.Sprintf("%q: exports no traces: set OTEL_EXPORTER_OTLP_ENDPOINT to Jaeger's OTLP/HTTP receiver, http://jaeger:%s", s.Name, otlpHTTPPort))
		default:
			problems = append(problems, d.checkCollector(s.Name, endpointVar, endpoint)...)
		}
		name := env("OTEL_SERVICE_NAME")
		if other, taken := named[name]; name != "" && taken && other != bin {
			problems = append(problems, fmt.Sprintf("%q: OTEL_SERVICE_NAME=%q is also the name of %s's spans: a trace would not tell the two apart", s.Name, name, other))
		}
		named[name] = bin
	}
	return problems
}

// checkCollector checks that an OTLP endpoint is the OTLP/HTTP receiver
// of a Jaeger service.
func (d *deployment) checkCollector(service, endpointVar, endpoint string) []string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return []string{fmt.Sprintf("%q: %s=%q is not an http:// URL", service, endpointVar, endpoint)}
	}
	jaeger, ok := d.project.Services[u.Hostname()]
	if !ok || imageRepo(jaeger.Image) != observabilityServices["jaeger"] {
		return []string{fmt.Sprintf("%q: %s=%s: %q is not a service running Jaeger", service, endpointVar, endpoint, u.Hostname())}
	}
	var problems []string
	switch u.Port() {
	case otlpHTTPPort:
	case otlpGRPCPort:
		problems = append(problems, fmt.Sprintf("%q: %s=%s: port %s is OTLP/gRPC, but the binaries export OTLP/HTTP, to %s", service, endpointVar, endpoint, otlpGRPCPort, otlpHTTPPort))
	default:
		problems = append(problems, fmt.Sprintf("%q: %s=%s: Jaeger receives OTLP/HTTP on port %s", service, endpointVar, endpoint, otlpHTTPPort))
	}
	if getenvOf(jaeger.Environment)("COLLECTOR_OTLP_ENABLED") == "false" {
		problems = append(problems, fmt.Sprintf("%q: COLLECTOR_OTLP_ENABLED is false, so the spans %q sends are refused", jaeger.Name, service))
	}
	return problems
}

// scrapeConfig is the part of a Prometheus configuration the checks read.
type scrapeConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		Scheme        string `yaml:"scheme"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// prometheusConfigFile is where Prometheus' image reads its configuration
// unless --config.file says otherwise.
const prometheusConfigFile = "/etc/prometheus/prometheus.yml"

// scrapeConfigOf reads the configuration a Prometheus service runs with.
func (d *deployment) scrapeConfigOf(p types.ServiceConfig) (scrapeConfig, error) {
	inContainer := prometheusConfigFile
	for _, arg := range p.Command {
		if v, ok := strings.CutPrefix(arg, "--config.file="); ok {
			inContainer = v
		}
	}
	file := d.hostPath(p, inContainer)
	if file == "" {
		return scrapeConfig{}, fmt.Errorf("nothing is mounted at %s, its configuration", inContainer)
	}
	var cfg scrapeConfig
	text, err := os.ReadFile(file)
	if err == nil {
		err = yaml.Unmarshal(text, &cfg)
	}
	if err != nil {
		return scrapeConfig{}, fmt.Errorf("%s: %w", file, err)
	}
	return cfg, nil
}

// checkScrapes: Prometheus scrapes exactly the admin listeners of the
// serving Go services whose binaries serve /metrics (binary.metrics), at
// the ports their own config loaders say. A target missing is a binary
// whose metrics no one sees; one too many is a target down for ever,
// usually a port changed on one side only, or a listener with no /metrics
// at all: the lab's page.
func checkScrapes(d *deployment) []string {
	var problems []string
	want := map[string]string{}    // "service:port" → the variable making it listen there
	without := map[string]string{} // "service:port" of a listener serving no /metrics → why
	for _, s := range d.servingGoServices() {
		name, b, _ := binaryOf(s)
		cfg, _ := config(s)
		for _, v := range b.listenVars() {
			port, err := portOf(cfg.listens[v])
			if err != nil {
				continue // checkPorts reports it
			}
			target := net.JoinHostPort(s.Name, strconv.Itoa(int(port)))
			switch {
			case v == b.adminVar && b.metrics:
				want[target] = fmt.Sprintf("%s=%q", v, cfg.listens[v])
			case v == b.adminVar:
				without[target] = fmt.Sprintf("%s=%q: %s serves no /metrics", v, cfg.listens[v], name)
			default:
				without[target] = fmt.Sprintf("%s=%q, not its admin listener", v, cfg.listens[v])
			}
		}
	}
	for _, p := range d.servicesOf(observabilityServices["prometheus"]) {
		cfg, err := d.scrapeConfigOf(p)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %v", p.Name, err))
			continue
		}
		got := map[string]string{} // target → job
		for _, sc := range cfg.ScrapeConfigs {
			if mp := cmp.Or(sc.MetricsPath, "/metrics"); mp != "/metrics" {
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes %s, but the binaries serve /metrics", p.Name, sc.JobName, mp))
			}
			if scheme := cmp.Or(sc.Scheme, "http"); scheme != "http" {
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes over %s, but the admin listeners speak plain http", p.Name, sc.JobName, scheme))
			}
			for _, st := range sc.StaticConfigs {
				for _, target := range st.Targets {
					got[target] = sc.JobName
				}
			}
		}
		for _, target := range slices.Sorted(maps.Keys(want)) {
			if _, ok := got[target]; !ok {
				problems = append(problems, fmt.Sprintf("%q: does not scrape %s, the admin listener there (%s)", p.Name, target, want[target]))
			}
		}
		for _, target := range slices.Sorted(maps.Keys(got)) {
			_, ok := want[target]
			switch why, listening := without[target]; {
			case ok:
			case listening:
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes %s (%s)", p.Name, got[target], target, why))
			default:
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes %s, which is no Go service's admin listener (those are %v)", p.Name, got[target], target, slices.Sorted(maps.Keys(want))))
			}
		}
	}
	return problems
}

// alertRulesFile holds the alert rules, with their unit tests beside it
// (alerts_test.go runs them), relative to the repository's root.
const alertRulesFile = "deploy/observability/alerts.yml"

// checkAlertRules: every Prometheus loads the alert rules, from a file
// mounted where its configuration says. A rule file missing from the
// container makes Prometheus refuse to start; one not listed is loaded by
// nobody, and its tested alerts would never fire.
func checkAlertRules(d *deployment) []string {
	var problems []string
	want := filepath.Join(d.project.WorkingDir, filepath.FromSlash(alertRulesFile))
	for _, p := range d.servicesOf(observabilityServices["prometheus"]) {
		cfg, err := d.scrapeConfigOf(p)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %v", p.Name, err))
			continue
		}
		loaded := false
		for _, file := range cfg.RuleFiles {
			switch d.hostPath(p, file) {
			case "":
				problems = append(problems, fmt.Sprintf("%q: loads rule file %s, where nothing is mounted", p.Name, file))
			case want:
				loaded = true
			}
		}
		if !loaded {
			problems = append(problems, fmt.Sprintf("%q: does not load %s (rule_files, and a volume mounting it)", p.Name, alertRulesFile))
		}
	}
	return problems
}
