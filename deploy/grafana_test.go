package deploy

// This file checks Grafana's provisioning: its data source reaches the
// profile's Prometheus, and its dashboard is loaded and names that data
// source.

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// checkGrafana: Grafana starts with a data source for the profile's
// Prometheus and with the dashboard, provisioned from files mounted into
// the container, and lets whoever opens it view them without logging in,
// but not change them.
func checkGrafana(d *deployment) []string {
	var problems []string
	for _, g := range d.servicesOf(observabilityServices["grafana"]) {
		env := getenvOf(g.Environment)
		if env("GF_AUTH_ANONYMOUS_ENABLED") != "true" {
			problems = append(problems, fmt.Sprintf("%q: GF_AUTH_ANONYMOUS_ENABLED is not \"true\": the dashboard would ask for a login", g.Name))
		} else if role := cmp.Or(env("GF_AUTH_ANONYMOUS_ORG_ROLE"), "Viewer"); role != "Viewer" {
			problems = append(problems, fmt.Sprintf("%q: GF_AUTH_ANONYMOUS_ORG_ROLE=%s lets anyone change the dashboard and the data source; want Viewer", g.Name, role))
		}
		provisioning := cmp.Or(env("GF_PATHS_PROVISIONING"), "/etc/grafana/provisioning")
		uids, p := d.grafanaDatasources(g, path.Join(provisioning, "datasources"))
		problems = append(problems, p...)
		problems = append(problems, d.grafanaDashboards(g, path.Join(provisioning, "dashboards"), uids)...)
	}
	return problems
}

// provisioningFiles hands each YAML file Grafana finds in dir, a path in
// its container, to each, with the host path it was read from.
func (d *deployment) provisioningFiles(g types.ServiceConfig, dir string, each func(file string, text []byte) error) error {
	host := d.hostPath(g, dir)
	if host == "" {
		return fmt.Errorf("nothing is mounted at %s", dir)
	}
	entries, err := os.ReadDir(host)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); e.IsDir() || ext != ".yml" && ext != ".yaml" {
			continue
		}
		file := filepath.Join(host, e.Name())
		text, err := os.ReadFile(file)
		if err == nil {
			err = each(file, text)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
	return nil
}

// grafanaDatasources checks the provisioned data sources and returns the
// uids of those that reach the profile's Prometheus.
func (d *deployment) grafanaDatasources(g types.ServiceConfig, dir string) (map[string]bool, []string) {
	var problems []string
	uids := map[string]bool{}
	err := d.provisioningFiles(g, dir, func(file string, text []byte) error {
		var f struct {
			Datasources []struct {
				Name string `yaml:"name"`
				UID  string `yaml:"uid"`
				Type string `yaml:"type"`
				URL  string `yaml:"url"`
			} `yaml:"datasources"`
		}
		if err := yaml.Unmarshal(text, &f); err != nil {
			return err
		}
		for _, ds := range f.Datasources {
			if ds.Type != "prometheus" {
				continue
			}
			u, err := url.Parse(ds.URL)
			if err != nil {
				return err
			}
			prom, ok := d.project.Services[u.Hostname()]
			switch {
			case !ok || imageRepo(prom.Image) != observabilityServices["prometheus"]:
				problems = append(problems, fmt.Sprintf("%q: data source %q (%s) points at %q, which is not a service running Prometheus", g.Name, ds.Name, filepath.Base(file), u.Hostname()))
			case u.Port() != prometheusPort:
				problems = append(problems, fmt.Sprintf("%q: data source %q (%s) uses port %q, but Prometheus listens on %s", g.Name, ds.Name, filepath.Base(file), u.Port(), prometheusPort))
			case ds.UID == "":
				problems = append(problems, fmt.Sprintf("%q: data source %q (%s) has no uid, so the dashboard cannot name it", g.Name, ds.Name, filepath.Base(file)))
			default:
				uids[ds.UID] = true
			}
		}
		return nil
	})
	if err != nil {
		problems = append(problems, fmt.Sprintf("%q: data sources: %v", g.Name, err))
	} else if len(uids) == 0 && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("%q: no Prometheus data source is provisioned in %s", g.Name, dir))
	}
	return uids, problems
}

// grafanaDashboards checks that the dashboard providers load at least one
// dashboard from a mounted folder, and that every data source a dashboard
// names is one provisioned (uids).
func (d *deployment) grafanaDashboards(g types.ServiceConfig, dir string, uids map[string]bool) []string {
	var problems []string
	dashboards := 0
	err := d.provisioningFiles(g, dir, func(file string, text []byte) error {
		var f struct {
			Providers []struct {
				Name    string `yaml:"name"`
				Type    string `yaml:"type"`
				Options struct {
					Path string `yaml:"path"`
				} `yaml:"options"`
			} `yaml:"providers"`
		}
		if err := yaml.Unmarshal(text, &f); err != nil {
			return err
		}
		for _, pr := range f.Providers {
			host := d.hostPath(g, pr.Options.Path)
			if host == "" {
				problems = append(problems, fmt.Sprintf("%q: dashboard provider %q (%s) loads %s, where nothing is mounted", g.Name, pr.Name, filepath.Base(file), pr.Options.Path))
				continue
			}
			files, err := filepath.Glob(filepath.Join(host, "*.json"))
			if err != nil {
				return err
			}
			for _, f := range files {
				dashboards++
				for _, uid := range dashboardDatasources(f) {
					if !uids[uid] {
						problems = append(problems, fmt.Sprintf("%q: dashboard %s names data source %q, which is not a provisioned Prometheus data source %v", g.Name, filepath.Base(f), uid, slices.Sorted(maps.Keys(uids))))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		problems = append(problems, fmt.Sprintf("%q: dashboards: %v", g.Name, err))
	} else if dashboards == 0 && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("%q: no dashboard is provisioned (%s)", g.Name, dir))
	}
	return problems
}

// dashboardDatasources returns the uid of every data source a dashboard
// JSON names, in the panels and in their queries; "invalid JSON" when it
// cannot be read.
func dashboardDatasources(file string) []string {
	text, err := os.ReadFile(file)
	var doc any
	if err == nil {
		err = json.Unmarshal(text, &doc)
	}
	if err != nil {
		return []string{"(unreadable: " + err.Error() + ")"}
	}
	seen := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ds, ok := v["datasource"].(map[string]any); ok {
				if uid, ok := ds["uid"].(string); ok {
					seen[uid] = true
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return slices.Sorted(maps.Keys(seen))
}
