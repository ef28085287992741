package sluice

import (
	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/module"
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

// Config configures a sluice program: what it is made of (its River
// workers, migrations, modules, declared limits and schedules, River config
// and tracer provider) and how its workers run. Each field is documented
// once, on app.Config; New and Migrate use them all, and Main takes them
// as the defaults of its flags.
type Config = app.Config
