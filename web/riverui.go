package web

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"riverqueue.com/riverui"
)

// RiverUIPath is where River UI is served, under the handler's root.
const RiverUIPath = "/riverui"

// RiverUI is River UI (riverqueue.com/riverui, the open-source bundle)
// served from the process, on a River client: it shows and steers River's
// jobs and queues in River's schema (the client's Schema). Mount it at
// RiverUIPath+"/" of a handler whose own mount prefix was given to
// NewRiverUI.
//
// River UI's background services (job counts it refreshes every few
// seconds, and exact counts of the whole table now and then) start on its
// first request after Run, not before: a worker on which nobody opens River
// UI adds no queries, however many workers there are. Until then (or
// without Run) River UI counts on each request instead.
type RiverUI struct {
	handler *riverui.Handler
	// mount is the prefix the whole handler is mounted under ("" at the
	// root), which http.StripPrefix removed before the request got here.
	mount  string
	logger *slog.Logger

	mu      sync.Mutex
	ctx     context.Context // Run's; nil before
	started bool
}

// NewRiverUI builds River UI on client. mount is the path prefix the
// handler serving River UI at RiverUIPath is itself mounted under ("" or
// "/jobs", say): River UI is a single-page application that builds the
// URLs of its assets and API from its full path.
func NewRiverUI(client *river.Client[pgx.Tx], mount string, logger *slog.Logger) (*RiverUI, error) {
	if err := ValidatePrefix(mount); err != nil {
		return nil, err
	}
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    logger,
		Prefix:    mount + RiverUIPath,
	})
	if err != nil {
		return nil, fmt.Errorf("build River UI: %w", err)
	}
	return &RiverUI{handler: h, mount: mount, logger: logger}, nil
}

// Run lets River UI start its background services at its first request;
// they stop when ctx is done.
func (u *RiverUI) Run(ctx context.Context) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ctx = ctx
}

// startOnce starts the background services if Run was called, once.
func (u *RiverUI) startOnce() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.started || u.ctx == nil || u.ctx.Err() != nil {
		return
	}
	u.started = true
	if err := u.handler.Start(u.ctx); err != nil {
		u.logger.Warn("River UI's background services did not start: it counts jobs on each request instead", "error", err)
	}
}

// ServeHTTP serves River UI. The request's path starts with RiverUIPath;
// River UI expects its full path, so the mount prefix an outer
// http.StripPrefix removed is put back first.
func (u *RiverUI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.startOnce()
	if u.mount != "" {
		r2 := new(http.Request)
		*r2 = *r
		r2.URL = new(url.URL)
		*r2.URL = *r.URL
		r2.URL.Path = u.mount + r.URL.Path
		if r.URL.RawPath != "" {
			r2.URL.RawPath = u.mount + r.URL.RawPath
		}
		r = r2
	}
	u.handler.ServeHTTP(w, r)
}
