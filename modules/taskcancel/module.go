// Package taskcancel is the task-cancellation module (seed 000, OpenSearch's
// TaskCancellationMonitoringService): a tracker of jobs whose cancellation
// was requested while they ran (a trigger on river_job fills it, whichever
// client cancels), and task_cancellation.monitor, every 5 seconds by its
// default schedule, which counts per kind the jobs still running long after
// their cancellation. Its counters are the "task_cancellation" section of
// the stats document, Prometheus gauges and a web page. It covers every kind of the
// program, the application's own included.
package taskcancel

import (
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/metrics"
	"github.com/sluice-dev/sluice/module"
)

// Module returns the task-cancellation module.
func Module() module.Module {
	return module.Module{
		Migrations: migrations(),
		Name:       "taskcancel",
		Kinds:      []kinds.Kind{kinds.Of[TaskCancellationMonitorArgs]()},
		AddWorkers: func(workers *river.Workers, env *module.Env) error {
			return river.AddWorkerSafely(workers, &TaskCancellationMonitorWorker{
				monitor: NewMonitor(env.Pool, env.Logger), jobTimeout: env.JobTimeout,
			})
		},
		Stats: []module.StatsReader{{Name: "task_cancellation", Read: readStatsSection}},
		Pages: []module.Page{page()},
		ClusterSources: func(*module.Env) []metrics.ClusterSource {
			return []metrics.ClusterSource{clusterSource}
		},
	}
}
