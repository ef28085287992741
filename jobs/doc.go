// Package jobs holds sluice's River workers, one per file, the registry of job
// kinds this binary knows, and the middleware shared by every worker: job
// metrics and the maintenance-run framework (advisory lock + journal) used by
// every maintenance kind.
package jobs
