package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/natsbus"
)

// secretsIncludedBy names the Docker secrets that config files of ours,
// mounted in s, read from /run/secrets.
func secretsIncludedBy(s types.ServiceConfig) []string {
	var out []string
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		b, err := os.ReadFile(v.Source)
		if err != nil {
			continue // a folder, or a file the other checks complain of
		}
		for _, m := range regexp.MustCompile(`/run/secrets/([A-Za-z0-9_.-]+)`).FindAllStringSubmatch(string(b), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// natsConf is deploy/nats/nats.conf as a NATS server reads it, with the
// passwords file it includes from a secret put in place.
func natsConf(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("nats", "nats.conf"))
	require.NoError(t, err)
	pw, err := os.ReadFile(filepath.Join("secrets", "nats_passwords.conf"))
	require.NoError(t, err)
	text := strings.Replace(string(raw), "include /run/secrets/nats_passwords.conf", string(pw), 1)
	require.NotEqual(t, string(raw), text, "nats.conf includes /run/secrets/nats_passwords.conf")
	t.Setenv("NATS_NODE", "nats-1")
	m, err := conf.Parse(text)
	require.NoError(t, err)
	return m
}

// The cluster's users are the processes' own, each allowed exactly what
// internal/natsbus says it needs, with the password its process reads.
func TestNATSConfigMatchesCode(t *testing.T) {
	users := map[string]map[string]any{}
	auth, ok := natsConf(t)["authorization"].(map[string]any)
	require.True(t, ok, "nats.conf has an authorization block")
	list, ok := auth["users"].([]any)
	require.True(t, ok)
	for _, u := range list {
		m := u.(map[string]any)
		users[m["user"].(string)] = m
	}
	require.ElementsMatch(t, []string{"admin", natsbus.SenderUser, natsbus.UsersUser}, slices.Collect(mapsKeys(users)))
	for user, file := range map[string]string{
		"admin": "nats_admin_password.txt", natsbus.SenderUser: "nats_sender_password.txt", natsbus.UsersUser: "nats_users_password.txt",
	} {
		b, err := os.ReadFile(filepath.Join("secrets", file))
		require.NoError(t, err)
		require.Equal(t, strings.TrimSpace(string(b)), users[user]["password"], "%s's password in nats_passwords.conf and %s", user, file)
		if user == "admin" {
			require.Nil(t, users[user]["permissions"], "admin may do anything: it provisions")
			continue
		}
		want, _ := natsbus.PermissionsOf(user)
		perms := users[user]["permissions"].(map[string]any)
		require.ElementsMatch(t, want.Publish, allowList(t, perms, "publish"), "%s may publish", user)
		require.ElementsMatch(t, want.Subscribe, allowList(t, perms, "subscribe"), "%s may subscribe", user)
	}
}

func mapsKeys(m map[string]map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func allowList(t *testing.T, perms map[string]any, which string) []string {
	t.Helper()
	p, ok := perms[which].(map[string]any)
	require.True(t, ok, "%s permissions", which)
	var out []string
	for _, s := range p["allow"].([]any) {
		out = append(out, s.(string))
	}
	return out
}

// The cluster in compose: three nodes routed to each other, the
// provisioning job keeping each stream on all three and running before
// the processes that read them, and both processes reaching every node
// with their own NATS password.
func TestComposeBroker(t *testing.T) {
	content, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	d := loadDeployment(t, composeFile, content, map[string]string{})
	p := d.project
	nodes := []string{"nats-1", "nats-2", "nats-3"}
	routes := natsConf(t)["cluster"].(map[string]any)["routes"].([]any)
	var urls []string
	for _, n := range nodes {
		s, ok := p.Services[n]
		require.True(t, ok, "service %s", n)
		require.Equal(t, n, *s.Environment["NATS_NODE"], "%s names itself", n)
		require.NotNil(t, s.HealthCheck, "%s has a healthcheck", n)
		require.Contains(t, routes, fmt.Sprintf("nats-route://%s:6222", n))
		urls = append(urls, fmt.Sprintf("nats://%s:4222", n))
	}
	cluster := strings.Join(urls, ",")

	prov, ok := p.Services["broker-provision"]
	require.True(t, ok)
	require.True(t, isBrokerProvision(prov))
	require.Equal(t, cluster, *prov.Environment["SENDER_NATS_URL"])
	require.Equal(t, strconv.Itoa(len(nodes)), *prov.Environment["SENDER_NATS_REPLICAS"], "every stream on every node")
	requireSecretFile(t, p, "nats_admin_password", *prov.Environment["SENDER_NATS_ADMIN_PASSWORD_FILE"])
	require.Equal(t, []string{"nats_admin_password"}, secretNames(prov))
	for _, n := range nodes {
		require.Equal(t, types.ServiceConditionHealthy, prov.DependsOn[n].Condition, "provisioning waits for %s", n)
	}

	for name, want := range map[string]struct{ urlVar, pwVar, secret string }{
		"outbox-sender": {"SENDER_NATS_URL", "SENDER_NATS_PASSWORD_FILE", "nats_sender_password"},
		"users":         {"USERS_NATS_URL", "USERS_NATS_PASSWORD_FILE", "nats_users_password"},
	} {
		s := p.Services[name]
		require.Equal(t, cluster, *s.Environment[want.urlVar], "%s reaches every node", name)
		requireSecretFile(t, p, want.secret, *s.Environment[want.pwVar])
		require.Contains(t, secretNames(s), want.secret, name)
		require.NotContains(t, secretNames(s), "nats_admin_password", "%s never gets the admin's password", name)
		require.Equal(t, types.ServiceConditionCompletedSuccessfully, s.DependsOn["broker-provision"].Condition, "%s starts after the streams exist", name)
	}
	require.Equal(t, "${SENDER_TRANSPORT:-http}", rawEnv(t, content, "SENDER_TRANSPORT"), "one host setting switches the transport")

	// The nodes run the server the tests embed.
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	require.NoError(t, err)
	v := regexp.MustCompile(`github.com/nats-io/nats-server/v2 v(\S+)`).FindSubmatch(mod)
	require.NotNil(t, v, "go.mod requires nats-server")
	for _, n := range nodes {
		require.Equal(t, "nats:"+string(v[1])+"-alpine", p.Services[n].Image, "%s runs the nats-server go.mod names", n)
	}
}

// requireSecretFile fails unless path is where the secret name is mounted
// (loadDeployment points /run/secrets/<name> at the secret's file).
func requireSecretFile(t *testing.T, p *types.Project, name, path string) {
	t.Helper()
	file := p.Secrets[name].File
	require.True(t, path == "/run/secrets/"+name || file != "" && path == file, "%s: want the secret %s, got %s", name, name, path)
}

func secretNames(s types.ServiceConfig) []string {
	var out []string
	for _, r := range s.Secrets {
		out = append(out, r.Source)
	}
	return out
}

// rawEnv is the value of a variable as written in the compose file.
func rawEnv(t *testing.T, content []byte, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+` + name + `:\s*(\S+)\s*$`).FindSubmatch(content)
	require.NotNil(t, m, "%s in docker-compose.yml", name)
	return string(m[1])
}
