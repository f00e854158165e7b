package deploy

// This file checks each Go service's environment against its binary's
// config loader, and its ports against its listeners and the image's
// EXPOSE.

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
)

func checkEnvironment(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		name, b, ok := binaryOf(s)
		if !ok {
			continue // checkBuild reports it
		}
		cfg, err := config(s)
		for _, v := range slices.Sorted(maps.Keys(s.Environment)) {
			// The OpenTelemetry SDK reads its own variables; a misspelt
			// one would silently do nothing too, and so would any in a
			// binary without the SDK.
			if strings.HasPrefix(v, "OTEL_") {
				if !b.traces {
					problems = append(problems, fmt.Sprintf("%q: %s does nothing: %s exports no traces", s.Name, v, name))
				} else if !otelVars[v] {
					problems = append(problems, fmt.Sprintf("%q: %s is not a variable the OpenTelemetry SDK reads, so setting it does nothing", s.Name, v))
				}
				continue
			}
			if !slices.Contains(cfg.names, v) {
				problems = append(problems, fmt.Sprintf("%q: %s is not read by %s, so setting it does nothing (it reads %v)", s.Name, v, name, cfg.names))
			}
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %s rejects this environment: %v", s.Name, name, err))
		}
	}
	return problems
}

// otelVars are the OpenTelemetry SDK's variables a service may set: the
// specification's general ones, the OTLP exporter's and the batch span
// processor's. They are not the config loaders' to list.
var otelVars = map[string]bool{}

func init() {
	for _, v := range []string{
		"OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_PROPAGATORS",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_TRACES_EXPORTER", "OTEL_LOG_LEVEL",
		"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
		"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
		"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT",
		"OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
	} {
		otelVars[v] = true
	}
	for _, signal := range []string{"", "TRACES_"} {
		for _, v := range []string{"ENDPOINT", "HEADERS", "TIMEOUT", "COMPRESSION", "PROTOCOL", "INSECURE",
			"CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			otelVars["OTEL_EXPORTER_OTLP_"+signal+v] = true
		}
	}
}

// checkPorts: every published container port is one the binary listens
// on, no listener is bound to the container's loopback, and every port it
// listens on, published or not, is in the image's
// EXPOSE (the list of what the image serves). An admin port (metrics, the
// sender's redrive, the lab's page) has no authentication, so it is
// published on the loopback interface only; a listener only other
// services call (the lab's fault proxy, which the sender calls) is not
// published at all.
func checkPorts(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		_, b, ok := binaryOf(s)
		if !ok {
			continue
		}
		if isMigration(s) {
			for _, p := range s.Ports {
				problems = append(problems, fmt.Sprintf("%q: publishes container port %d, but a migration listens on nothing", s.Name, p.Target))
			}
			continue
		}
		cfg, _ := config(s)
		listens := map[uint32]string{} // port → the variable that sets it
		var desc []string
		bad := false
		for _, v := range b.listenVars() {
			addr := cfg.listens[v]
			port, err := portOf(addr)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%q: %s=%q: %v", s.Name, v, addr, err))
				bad = true
				continue
			}
			if other, taken := listens[port]; taken {
				problems = append(problems, fmt.Sprintf("%q: %s=%q and %s=%q both listen on %d", s.Name, other, cfg.listens[other], v, addr, port))
				bad = true
			}
			// Inside a container, loopback is the container's own: neither a
			// published port nor another service reaches it.
			if host, _, _ := net.SplitHostPort(addr); host == "localhost" || net.ParseIP(host).IsLoopback() {
				problems = append(problems, fmt.Sprintf("%q: %s=%q listens on loopback inside its container, where nothing else can reach it: listen on \":%d\"", s.Name, v, addr, port))
			}
			listens[port] = v
			desc = append(desc, fmt.Sprintf("%s=%q listens on %d", v, addr, port))
		}
		if bad {
			continue
		}
		var img image
		if s.Build != nil {
			img = d.images[dockerfilePath(s.Build)]
		}
		published := map[uint32]bool{}
		for _, p := range s.Ports {
			published[p.Target] = true
			v, ok := listens[p.Target]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%q: publishes container port %d, but nothing listens there: %s", s.Name, p.Target, strings.Join(desc, ", ")))
			case slices.Contains(b.internalVars, v):
				problems = append(problems, fmt.Sprintf("%q: publishes port %d (%s), which only other services call, over the compose network: do not publish it", s.Name, p.Target, v))
			case v == b.adminVar && !loopback(p.HostIP):
				problems = append(problems, fmt.Sprintf("%q: publishes its admin port %d (%s) on every interface, but it has no authentication: publish it as \"127.0.0.1:%s:%d\"", s.Name, p.Target, v, cmp.Or(p.Published, strconv.Itoa(int(p.Target))), p.Target))
			}
			// An image that failed to load is checkBuild's to report.
			if img.installed != nil && !slices.Contains(img.expose, p.Target) {
				problems = append(problems, fmt.Sprintf("%q: container port %d is not in the Dockerfile's EXPOSE %v", s.Name, p.Target, img.expose))
			}
		}
		for _, port := range slices.Sorted(maps.Keys(listens)) {
			if img.installed != nil && !published[port] && !slices.Contains(img.expose, port) {
				problems = append(problems, fmt.Sprintf("%q: listens on %d (%s), which is not in the Dockerfile's EXPOSE %v", s.Name, port, listens[port], img.expose))
			}
		}
	}
	return problems
}

// loopback says whether a published port's host address is reachable from
// this host only.
func loopback(hostIP string) bool {
	ip := net.ParseIP(hostIP)
	return ip != nil && ip.IsLoopback()
}

func portOf(addr string) (uint32, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("want a fixed port, got %q", p)
	}
	return uint32(n), nil
}
