package sluice

import (
	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/policy"
	"github.com/sluice-dev/sluice/scheduler"
)

// Module is a set of job kinds with their workers, migrations, default
// schedules and commands that a program turns on as a whole (see package
// modules for sluice's own).
type Module = module.Module

// Limit is the limits of one job kind a program declares in Go: a per-kind
// concurrency limit, a per-key one over args fields, a rate limit (see
// Config.Limits).
type Limit = limiter.Limit

// Rate is a rate limit: at most Max starts of a kind (or of each key) in any
// window of Per.
type Rate = limiter.Rate

// Schedule is a durable schedule a program declares in Go (see
// Config.Schedules): a name, a cron expression in a time zone, the typed
// args of the job to insert (its kind comes from them) and their insert
// options.
type Schedule = scheduler.Declared

// Misfire policies of a Schedule: what a dispatch does when more than one
// due time has passed (README, "Misfires").
const (
	// MisfireRunOnce (the default) collapses the missed due times into one
	// run, for the latest of them.
	MisfireRunOnce = scheduler.MisfireRunOnce
	// MisfireSkip runs the latest due time only if it is recent, else
	// nothing.
	MisfireSkip = scheduler.MisfireSkip
	// MisfireRunAll runs every missed due time, up to a cap.
	MisfireRunAll = scheduler.MisfireRunAll
)

// Policy is the enqueue policy of one job kind a program declares in Go
// (see Config.Policies): a cap on the waiting jobs of a key and what a
// conflicting insert does.
type Policy = policy.Policy

// What an insert does when its key is full (Policy.OnConflict).
const (
	// Discard does not insert the new job; River's client answers with the
	// waiting job (UniqueSkippedAsDuplicate).
	Discard = policy.Discard
	// Replace gives the newest waiting job the new args.
	Replace = policy.Replace
	// Debounce replaces and delays the job, within Policy.MaxDelay.
	Debounce = policy.Debounce
	// Reject fails the insert (SQLSTATE SLR01; see policy.AsRejected).
	Reject = policy.Reject
)

// Config configures a sluice program: what it is made of (its River
// workers, migrations, modules, declared limits and schedules, River config
// and tracer provider) and how its workers run. Each field is documented
// once, on app.Config; New and Migrate use them all, and Main takes them
// as the defaults of its flags.
type Config = app.Config
