// Package cibuilds is the CI-builds module (seed 001, GitLab's
// Ci::StuckBuilds::DropCancelingWorker and its siblings): the ci_builds
// table, in GitLab's vocabulary, and four maintenance kinds that fail the
// builds stuck in canceling, running, scheduled or pending, each with its
// default schedule and timeout setting.
package cibuilds

import (
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/module"
)

// Module returns the CI-builds module.
func Module() module.Module {
	return module.Module{
		Migrations: migrations(),
		Name:       "cibuilds",
		Kinds: []kinds.Kind{
			kinds.Of[DropCancelingBuildsArgs](),
			kinds.Of[DropRunningBuildsArgs](),
			kinds.Of[DropScheduledBuildsArgs](),
			kinds.Of[DropPendingBuildsArgs](),
		},
		AddWorkers: addWorkers,
	}
}

func addWorkers(workers *river.Workers, env *module.Env) error {
	metrics, err := NewMetrics(env.Registerer)
	if err != nil {
		return err
	}
	sweeper, err := NewSweeper(SweeperConfig{Pool: env.Pool, Settings: env.Settings, Logger: env.Logger, Metrics: metrics})
	if err != nil {
		return err
	}
	r := env.Maintenance
	for _, add := range []func() error{
		func() error { return addSweepWorker[DropCancelingBuildsArgs](workers, sweeper, Canceling, r) },
		func() error { return addSweepWorker[DropRunningBuildsArgs](workers, sweeper, Running, r) },
		func() error { return addSweepWorker[DropScheduledBuildsArgs](workers, sweeper, Scheduled, r) },
		func() error { return addSweepWorker[DropPendingBuildsArgs](workers, sweeper, Pending, r) },
	} {
		if err := add(); err != nil {
			return err
		}
	}
	return nil
}
