package faultlab

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/service"
)

// adminMaxConns caps the page's open connections: a few people's tabs.
const adminMaxConns = 64

// Run runs the lab until ctx ends: the fault proxy on LAB_PROXY_ADDR and
// the page on LAB_HTTP_ADDR. args may be "healthcheck", which asks the
// running lab's /readyz.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, _, err := LoadConfig(getenv)
	if err != nil {
		return err
	}
	if len(args) > 0 {
		// The lab has no database of its own and no migrations; Binary
		// handles "healthcheck" and refuses anything else.
		return service.Binary{Name: "lab", HealthAddr: cfg.HTTPAddr, LogLevel: cfg.LogLevel}.Run(ctx, args, stdout)
	}
	log, err := service.NewLogger(stdout, cfg.LogLevel)
	if err != nil {
		return err
	}
	log = log.With(slog.String("service", "lab"))

	// Small pools: the page's reading holds one connection of each at a
	// time. The statement timeout bounds a reading the page is waiting for.
	limits := database.Limits{MaxConns: 2, StatementTimeout: readTimeout}
	student, err := database.Open(ctx, cfg.StudentDatabaseURL, limits)
	if err != nil {
		return err
	}
	defer student.Close()
	users, err := database.Open(ctx, cfg.UsersDatabaseURL, limits)
	if err != nil {
		return err
	}
	defer users.Close()

	usersURL, err := url.Parse(cfg.UsersURL) // LoadConfig checked it
	if err != nil {
		return err
	}
	proxy, err := NewProxy(ctx, log, cfg.ProxyAddr, usersURL)
	if err != nil {
		return err
	}
	observer := NewObserver(log, student, users, proxy, map[string]string{
		"student": joinURL(cfg.StudentAdminURL, "/readyz"),
		"sender":  joinURL(cfg.SenderAdminURL, "/readyz"),
		"users":   joinURL(cfg.UsersAdminURL, "/readyz"),
	}, cfg.SenderCaller)
	cfg.StudentURL = strings.TrimRight(cfg.StudentURL, "/")
	cfg.SenderAdminURL = strings.TrimRight(cfg.SenderAdminURL, "/")
	api := &API{log: log, proxy: proxy, observer: observer, cfg: cfg, client: &http.Client{}}

	// Ready means serving: the page and the proxy work while a database is
	// down, and say so on the page.
	router := httpapi.NewRouter(log, func(context.Context) error { return nil })
	api.Routes(router)
	// The databases it reads are named, so that one left at its default
	// (localhost:5432) while the system runs elsewhere shows at once.
	log.Info("lab starting", slog.String("users_url", usersURL.Redacted()), slog.String("page", cfg.HTTPAddr), slog.String("proxy", cfg.ProxyAddr),
		slog.String("student_database", database.Where(cfg.StudentDatabaseURL)), slog.String("users_database", database.Where(cfg.UsersDatabaseURL)))
	return service.RunParts(ctx, []service.Part{
		service.Server(log, "page", "LAB_HTTP_ADDR", cfg.HTTPAddr, adminMaxConns, router),
		{Name: "LAB_PROXY_ADDR=" + cfg.ProxyAddr, Run: proxy.Run},
	})
}
