package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"path"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/web"
)

// httpConfig is what the worker's HTTP handler serves.
type httpConfig struct {
	pool     *pgxpool.Pool
	registry *prometheus.Registry
	modules  []module.Module
	client   *Client
	// token guards everything but /healthz and /readyz ("" guards
	// nothing); prefix is where the handler is mounted.
	token, prefix string
	logger        *slog.Logger
	// pprof serves net/http/pprof at /debug/pprof/.
	pprof bool
}

// newHTTPHandler serves /healthz (the process is alive) and /readyz (the
// database answers) to anyone, and behind the token (when set) /metrics
// (Prometheus), /stats (stats.go), /health (checkHealth), River UI at
// /riverui/, sluice's pages at /ui/ (/ leads there) and, when asked,
// Go's profiles at /debug/pprof/. Requests that
// change something (River UI's) are refused when they come from another
// origin.
func newHTTPHandler(cfg httpConfig) (http.Handler, *web.RiverUI, error) {
	riverUI, err := web.NewRiverUI(cfg.client, cfg.prefix, riverLogger(cfg.logger))
	if err != nil {
		return nil, nil, err
	}
	var pageModules []module.Page
	for _, m := range cfg.modules {
		pageModules = append(pageModules, m.Pages...)
	}
	pages, err := web.NewPages(web.PagesConfig{
		DB:          cfg.pool,
		ModulePages: pageModules,
		RiverUI:     ".." + web.RiverUIPath + "/",
		Links: []web.Link{
			{Title: "/health", Href: "../health", Summary: "workers, dispatchers and schedules as JSON (as sluice health --json)"},
			{Title: "/stats", Href: "../stats", Summary: "the stats document (as sluice stats --json)"},
			{Title: "/metrics", Href: "../metrics", Summary: "Prometheus metrics"},
		},
		Logger: cfg.logger,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("build the web pages: %w", err)
	}

	guarded := http.NewServeMux()
	guarded.Handle("GET /metrics", promhttp.HandlerFor(cfg.registry, promhttp.HandlerOpts{Registry: cfg.registry}))
	guarded.HandleFunc("GET /stats", statsHandler(cfg.pool, cfg.modules)) // the stats document (stats.go)
	guarded.HandleFunc("GET /health", healthHandler(cfg.pool))
	guarded.Handle(web.RiverUIPath+"/", riverUI)
	guarded.Handle(web.PagesPath+"/", http.StripPrefix(web.PagesPath, pages))
	// Relative redirects, so that they hold under any mount prefix.
	guarded.Handle("GET /{$}", relativeRedirect("ui/"))
	guarded.Handle("GET "+web.PagesPath, relativeRedirect("ui/"))
	guarded.Handle("GET "+web.RiverUIPath, relativeRedirect("riverui/"))
	if cfg.pprof {
		// pprof.Index serves the named profiles (heap, goroutine, allocs,
		// …) under /debug/pprof/; the others have handlers of their own.
		guarded.HandleFunc("GET /debug/pprof/", pprof.Index)
		guarded.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		guarded.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		guarded.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		guarded.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := cfg.pool.Ping(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "error": "database unreachable"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.Handle("/", web.RequireToken(cfg.token, guarded))
	return http.NewCrossOriginProtection().Handler(mux), riverUI, nil
}

// relativeRedirect redirects to to, resolved against the request's own
// URL (http.Redirect would make it absolute from the path after any
// http.StripPrefix, losing the prefix).
func relativeRedirect(to string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Location", to)
		w.WriteHeader(http.StatusFound)
	})
}

// mountAt serves h under prefix (nothing else), for the worker's own
// server; "" serves it at the root.
func mountAt(prefix string, h http.Handler) http.Handler {
	if prefix == "" {
		return h
	}
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	mux.Handle("GET "+prefix, relativeRedirect(path.Base(prefix)+"/"))
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
