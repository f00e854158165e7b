package deploy

// This file checks the sender's change-data-capture source: the host's
// SENDER_SOURCE picks it, and the database it streams from keeps WAL for
// its slot, within a bound.

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// checkSenderSource: the sender's source is the host's SENDER_SOURCE, poll
// when the host sets none, so that plain `docker compose up` polls (which
// asks nothing of PostgreSQL's configuration) and `SENDER_SOURCE=cdc docker
// compose up` streams without an edit to the file. Whether the sender
// accepts the value is checkEnvironment's to say: it runs the loader.
func checkSenderSource(d *deployment) []string {
	var problems []string
	want, host := "poll", "sets none"
	if v := d.env["SENDER_SOURCE"]; v != "" {
		want, host = v, fmt.Sprintf("sets %q", v)
	}
	for _, s := range d.servingGoServices() {
		if name, _, _ := binaryOf(s); name != "outbox-sender" {
			continue
		}
		switch got := getenvOf(s.Environment)("SENDER_SOURCE"); {
		case got == "":
			problems = append(problems, fmt.Sprintf("%q: SENDER_SOURCE is not set, so the host's SENDER_SOURCE cannot switch it: write ${SENDER_SOURCE:-poll}", s.Name))
		case got != want:
			problems = append(problems, fmt.Sprintf("%q: SENDER_SOURCE is %q when the host %s, want %q: write ${SENDER_SOURCE:-poll}", s.Name, got, host, want))
		}
	}
	return problems
}

// checkLogicalDecoding: the database a sender's replication connection
// reaches runs with wal_level=logical, without which the sender cannot
// create its slot and SENDER_SOURCE=cdc fails at start, and with
// max_slot_wal_keep_size bounding the WAL a slot may hold. Without the
// bound a stuck or abandoned slot keeps WAL until the disk is full and
// PostgreSQL stops; past it PostgreSQL invalidates the slot, and the
// sender falls back to polling and creates the slot again.
func checkLogicalDecoding(d *deployment) []string {
	var problems []string
	seen := map[string]bool{}
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		main, _ := d.databaseOf(s)
		urls, _ := d.connectionsOf(s, main, nil)
		for _, c := range b.more {
			u := urls[c.dbVar]
			if !c.replication || u == nil || seen[u.Hostname()] {
				continue // checkDatabases reports a URL that reaches no service
			}
			seen[u.Hostname()] = true
			dbSvc := d.project.Services[u.Hostname()]
			settings, ok := postgresSettings(dbSvc.Command)
			if !ok {
				problems = append(problems, fmt.Sprintf("%q: runs %q, so its settings cannot be checked: want [\"postgres\", \"-c\", \"wal_level=logical\", ...]", dbSvc.Name, dbSvc.Command))
				continue
			}
			if v := cmp.Or(settings["wal_level"], "replica (the default)"); v != "logical" {
				problems = append(problems, fmt.Sprintf("%q: wal_level is %s, but %q streams from it (%s): set -c wal_level=logical in its command", dbSvc.Name, v, s.Name, c.dbVar))
			}
			v := cmp.Or(settings["max_slot_wal_keep_size"], "-1")
			switch n, err := walSize(v); {
			case err != nil:
				problems = append(problems, fmt.Sprintf("%q: max_slot_wal_keep_size=%s: %v", dbSvc.Name, v, err))
			case n < 0:
				problems = append(problems, fmt.Sprintf("%q: max_slot_wal_keep_size is %s, no bound: a slot nobody reads would keep WAL until the disk is full; set a bound such as -c max_slot_wal_keep_size=1GB", dbSvc.Name, v))
			case n == 0:
				problems = append(problems, fmt.Sprintf("%q: max_slot_wal_keep_size is 0, so a slot may lose its WAL as soon as its reader falls behind; want a bound such as 1GB", dbSvc.Name))
			}
		}
	}
	return problems
}

// postgresSettings returns the server settings a postgres container's
// command sets (-c name=value, -cname=value or --name=value; a dash in a
// name is an underscore), and false when the command does not run the
// server. The image runs "postgres" with no settings when the command is
// empty, and runs "postgres" with the command as its arguments when the
// command starts with an option.
func postgresSettings(cmd []string) (map[string]string, bool) {
	settings := map[string]string{}
	if len(cmd) == 0 {
		return settings, true
	}
	args := cmd
	switch {
	case strings.HasPrefix(cmd[0], "-"):
	case path.Base(cmd[0]) == "postgres":
		args = cmd[1:]
	default:
		return nil, false
	}
	for i := 0; i < len(args); i++ {
		var kv string
		switch a := args[i]; {
		case a == "-c" && i+1 < len(args):
			kv = args[i+1]
			i++
		case strings.HasPrefix(a, "-c"):
			kv = strings.TrimPrefix(a, "-c")
		case strings.HasPrefix(a, "--"):
			kv = strings.TrimPrefix(a, "--")
		default:
			continue
		}
		if k, v, ok := strings.Cut(kv, "="); ok {
			settings[strings.ReplaceAll(strings.ToLower(k), "-", "_")] = v
		}
	}
	return settings, true
}

// walSize reads a PostgreSQL size setting in bytes: a whole number with
// one of its units (B, kB, MB, GB, TB), megabytes when it has none, as
// max_slot_wal_keep_size has. A negative number stays negative.
func walSize(v string) (int64, error) {
	n, mult := strings.TrimSpace(v), int64(1<<20)
	for _, u := range []struct {
		suffix string
		bytes  int64
	}{{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(n, u.suffix); ok {
			n, mult = strings.TrimSpace(rest), u.bytes
			break
		}
	}
	i, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return 0, errors.New("want a size such as 1GB (units B, kB, MB, GB, TB)")
	}
	return i * mult, nil
}
