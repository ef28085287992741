// Package app assembles a sluice process: the River client with every worker
// and middleware registered, the HTTP server (health, readiness, metrics) and,
// as later parts land, the schedule dispatcher. cmd/sluice is a thin CLI over
// it; end-to-end tests start the same code through the binary.
package app
