// Package app assembles a sluice process: the River client with every worker
// and middleware registered, the HTTP server (health, readiness, metrics), the
// schedule dispatcher and the worker's heartbeat row. cmd/sluice is a thin CLI
// over it; end-to-end tests start the same code through the binary.
package app
