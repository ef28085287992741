// Package demo is the demo module: demo.sleep, the canary job for smoke
// tests and benchmarks. It has no tables and no schedules.
package demo

import (
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/module"
)

// Module returns the demo module.
func Module() module.Module {
	return module.Module{
		Name:  "demo",
		Kinds: []kinds.Kind{kinds.Of[SleepArgs]()},
		AddWorkers: func(workers *river.Workers, env *module.Env) error {
			return river.AddWorkerSafely(workers, NewSleepWorker(env.JobTimeout))
		},
	}
}

// NewSleepWorker returns the worker of demo.sleep; jobTimeout is the slack
// its Timeout adds to the sleep (0: River's default of one minute).
func NewSleepWorker(jobTimeout time.Duration) *SleepWorker {
	if jobTimeout <= 0 {
		jobTimeout = time.Minute
	}
	return &SleepWorker{jobTimeout: jobTimeout}
}
