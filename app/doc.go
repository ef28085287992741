// Package app assembles a sluice process: the River client with every worker
// and middleware registered, the HTTP server (health, readiness, metrics), the
// schedule dispatcher, the worker's heartbeat row and the reaper that rescues
// the jobs of dead workers (liveness.go, reaper.go). cmd/sluice is a thin CLI
// over it; end-to-end tests start the same code through the binary.
package app
