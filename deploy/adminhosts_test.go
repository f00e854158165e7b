package deploy

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
)

// checkAdminHosts: an admin listener answers only the host names its
// hostsVar lists, besides loopback (httpapi.AllowHosts), so that a page
// rebound to its address cannot read it. Whoever calls one over the
// compose network, the lab and Prometheus, calls it by the service's
// name, which must then be listed, or every call is a 403.
func checkAdminHosts(d *deployment) []string {
	var problems []string
	// answers says whether the service called host answers to that name,
	// and the variable that lists its names.
	answers := func(host string) (string, bool) {
		s, ok := d.project.Services[host]
		if !ok {
			return "", true // the URL checks report it
		}
		_, b, _ := binaryOf(s)
		cfg, err := config(s)
		if err != nil {
			return b.hostsVar, true // checkEnvironment reports it
		}
		return b.hostsVar, slices.Contains(cfg.hosts, strings.ToLower(host))
	}
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		cfg, _ := config(s)
		for _, c := range b.calls {
			target := binaries[c.binary]
			if c.addrVar != target.adminVar {
				continue
			}
			u, err := url.Parse(cfg.urls[c.urlVar])
			if err != nil {
				continue // checkServiceURLs reports it
			}
			if hostsVar, ok := answers(u.Hostname()); !ok {
				problems = append(problems, fmt.Sprintf("%q: %s=%s calls %q by a name its %s does not list: every call would be refused (403)",
					s.Name, c.urlVar, cfg.urls[c.urlVar], u.Hostname(), hostsVar))
			}
		}
	}
	for _, p := range d.servicesOf(observabilityServices["prometheus"]) {
		cfg, err := d.scrapeConfigOf(p)
		if err != nil {
			continue // checkScrapes reports it
		}
		for _, sc := range cfg.ScrapeConfigs {
			for _, st := range sc.StaticConfigs {
				for _, target := range st.Targets {
					host, _, err := net.SplitHostPort(target)
					if err != nil {
						continue
					}
					if hostsVar, ok := answers(host); !ok {
						problems = append(problems, fmt.Sprintf("%q: job %q scrapes %s by a name its %s does not list: every scrape would be refused (403)",
							p.Name, sc.JobName, target, hostsVar))
					}
				}
			}
		}
	}
	return problems
}
