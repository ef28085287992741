// Package web is the worker's web side beside its JSON endpoints: River UI
// (riverqueue.com/riverui) embedded, sluice's own pages for what River UI
// does not show (schedules, concurrency limits and parked jobs, workers,
// maintenance runs, and the modules' pages such as the cancellation
// monitor's), rendered on the server with html/template, and the token that
// guards all of it off loopback. Package app assembles them into the
// worker's HTTP handler.
package web
