package deploy

// This file checks the start order: the healthchecks, and what each service
// waits for before it starts.

import (
	"cmp"
	"fmt"
	"maps"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
)

// checkStartOrder: each database a Go service connects to has a
// healthcheck; a migration waits for its database to be healthy and runs
// once; and a serving service waits for a migration of every database it
// connects to (the lab: Student's and Users') to have completed.
func checkStartOrder(d *deployment) []string {
	var problems []string
	dbs := map[string][]database{} // service → the databases it connects to, its main one first
	healthchecked := map[string]bool{}
	for _, s := range d.goServices() {
		db, _ := d.databaseOf(s)
		dbs[s.Name] = []database{db}
		if _, b, ok := binaryOf(s); ok && !isMigration(s) {
			cfg, _ := config(s)
			for _, c := range b.more {
				u, err := url.Parse(cfg.value(s.Environment, c.dbVar))
				if err != nil {
					continue // checkDatabases reports it
				}
				if other := databaseOfURL(u); !slices.Contains(dbs[s.Name], other) {
					dbs[s.Name] = append(dbs[s.Name], other)
				}
			}
		}
		for _, db := range dbs[s.Name] {
			dbSvc, ok := d.project.Services[db.host]
			if !ok || healthchecked[db.host] {
				continue
			}
			healthchecked[db.host] = true
			// Without a healthcheck service_healthy cannot be waited for, and
			// "started" only means the container exists, not that PostgreSQL
			// accepts connections.
			if !hasHealthcheck(dbSvc) {
				problems = append(problems, fmt.Sprintf("%q: has no healthcheck, so nothing can wait for it to accept connections", db.host))
			}
		}
	}
	for _, s := range d.goServices() {
		if _, _, ok := binaryOf(s); !ok {
			continue
		}
		if isMigration(s) {
			db := dbs[s.Name][0]
			if dep, ok := s.DependsOn[db.host]; !ok || dep.Condition != types.ServiceConditionHealthy {
				problems = append(problems, fmt.Sprintf("%q: must depend on %q with condition %s, not %s", s.Name, db.host, types.ServiceConditionHealthy, cmp.Or(dep.Condition, "none")))
			}
			// A migration restarted after success would never count as
			// completed, and the services waiting for it would never start.
			if s.Restart != "" && s.Restart != types.RestartPolicyNo {
				problems = append(problems, fmt.Sprintf("%q: restart %q; a migration must run once", s.Name, s.Restart))
			}
			continue
		}
		// A service started before its schema exists fails its first
		// queries, and one started before its role has a password cannot
		// log in: the migration must have finished, not merely started.
		for _, db := range dbs[s.Name] {
			migrated := false
			for dep, cond := range s.DependsOn {
				m, ok := d.project.Services[dep]
				if ok && isMigration(m) && len(dbs[dep]) > 0 && dbs[dep][0] == db && cond.Condition == types.ServiceConditionCompletedSuccessfully {
					migrated = true
				}
			}
			if !migrated {
				problems = append(problems, fmt.Sprintf("%q: must depend on a migration of %s with condition %s", s.Name, db, types.ServiceConditionCompletedSuccessfully))
			}
		}
	}
	return problems
}

// hasHealthcheck says whether Docker will run a healthcheck for s, so that
// service_healthy can be waited for.
func hasHealthcheck(s types.ServiceConfig) bool {
	hc := s.HealthCheck
	return hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE"
}

// packageOf resolves a command's first word in s's image, as checkBuild
// does, and returns the package that binary was built from. Without a
// loaded image (checkBuild reports why) it falls back to the binary's name.
func (d *deployment) packageOf(s types.ServiceConfig, cmd string) (string, bool) {
	if s.Build != nil {
		if img, ok := d.images[dockerfilePath(s.Build)]; ok {
			return img.lookup(cmd)
		}
	}
	b, ok := binaries[path.Base(cmd)]
	return path.Clean(b.pkg), ok
}

// checkHealthchecks: every serving Go service must have a healthcheck, or
// nothing can wait for it to be ready, and the healthcheck must be its own
// binary's "healthcheck" subcommand in exec form. The image is distroless:
// CMD-SHELL needs /bin/sh, which it lacks, so a shell-form test always fails
// and the service never becomes healthy. Running another binary's
// subcommand would ask the wrong port's /readyz.
func checkHealthchecks(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		if _, _, ok := binaryOf(s); !ok || isMigration(s) {
			continue
		}
		if !hasHealthcheck(s) {
			problems = append(problems, fmt.Sprintf("%q: has no healthcheck, so nothing can wait for it to be ready; want test [\"CMD\", %q, \"healthcheck\"]", s.Name, s.Command[0]))
			continue
		}
		test := s.HealthCheck.Test
		if test[0] != "CMD" {
			problems = append(problems, fmt.Sprintf("%q: healthcheck test is %s %q; the image has no shell, so it must be exec form [\"CMD\", %q, \"healthcheck\"]", s.Name, test[0], test[1:], s.Command[0]))
			continue
		}
		args := test[1:]
		if len(args) != 2 || args[1] != "healthcheck" {
			problems = append(problems, fmt.Sprintf("%q: healthcheck runs %q, want [%q \"healthcheck\"]", s.Name, args, s.Command[0]))
			continue
		}
		serves, ok := d.packageOf(s, s.Command[0])
		if !ok {
			continue // checkBuild reports it
		}
		checks, ok := d.packageOf(s, args[0])
		if !ok {
			problems = append(problems, fmt.Sprintf("%q: healthcheck runs %q, which is not a binary the Dockerfile builds and copies into the final image", s.Name, args[0]))
			continue
		}
		if checks != serves {
			problems = append(problems, fmt.Sprintf("%q: healthcheck runs %q, the binary built from %s, but the service runs the one built from %s", s.Name, args[0], strings.TrimPrefix(checks, "./"), strings.TrimPrefix(serves, "./")))
		}
	}
	return problems
}

// checkDependsOnConditions: a service waiting for a Go service must wait for
// the right thing. service_started only means the container exists; a
// migration must have finished, and a server with a healthcheck must answer
// /readyz. A server without a healthcheck is checkHealthchecks' to report.
func checkDependsOnConditions(d *deployment) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		s := d.project.Services[name]
		for _, depName := range slices.Sorted(maps.Keys(s.DependsOn)) {
			dep, ok := d.project.Services[depName]
			if _, _, isGo := binaryOf(dep); !ok || !isGo {
				continue
			}
			var want string
			switch {
			case isMigration(dep):
				want = types.ServiceConditionCompletedSuccessfully
			case hasHealthcheck(dep):
				want = types.ServiceConditionHealthy
			default:
				continue
			}
			if got := s.DependsOn[depName].Condition; got != want {
				problems = append(problems, fmt.Sprintf("%q: must depend on %q with condition %s, not %s", s.Name, depName, want, cmp.Or(got, "none")))
			}
		}
	}
	return problems
}
