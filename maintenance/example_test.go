package maintenance_test

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/maintenance"
)

// PurgeSessionsArgs are the args of an application's own maintenance kind.
type PurgeSessionsArgs struct{}

// Kind is the River job kind.
func (PurgeSessionsArgs) Kind() string { return "app.purge_sessions" }

// InsertOpts puts the kind on the maintenance queue, as every maintenance
// kind.
func (PurgeSessionsArgs) InsertOpts() river.InsertOpts { return maintenance.InsertOpts() }

// PurgeSessionsWorker runs each job under the maintenance framework: one
// run of the kind at a time across every worker, each run journaled.
type PurgeSessionsWorker struct {
	river.WorkerDefaults[PurgeSessionsArgs]
	Runner *maintenance.Runner
}

// Timeout bounds a run by the maintenance timeout.
func (w *PurgeSessionsWorker) Timeout(*river.Job[PurgeSessionsArgs]) time.Duration {
	return w.Runner.Timeout()
}

// Work takes the kind's advisory lock, records the run and purges.
func (w *PurgeSessionsWorker) Work(ctx context.Context, job *river.Job[PurgeSessionsArgs]) error {
	return w.Runner.Run(ctx, job.JobRow, func(ctx context.Context) (maintenance.Result, error) {
		// The body runs only while this process holds the kind's lock.
		return maintenance.Result{Affected: 3, Details: map[string]any{"purged": 3}}, nil
	})
}

// ExampleRunner_Run works one job of an application's own maintenance kind
// the way River would call its worker, and reads the run's journal row.
func ExampleRunner_Run() {
	ctx := context.Background()
	databaseURL, dropDatabase := testdb.NewForExample()
	defer dropDatabase()
	pool, err := pgkit.Open(ctx, databaseURL, 10*time.Second)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	runner, err := maintenance.NewRunner(maintenance.Config{Pool: pool, WorkerID: "example"})
	if err != nil {
		panic(err)
	}
	worker := &PurgeSessionsWorker{Runner: runner}
	job := &river.Job[PurgeSessionsArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: PurgeSessionsArgs{}.Kind()}}
	if err := worker.Work(ctx, job); err != nil {
		panic(err)
	}

	run, err := db.New(pool).GetMaintenanceRunByJob(ctx, &job.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(run.Kind, run.Status, run.Affected)
	// Output: app.purge_sessions succeeded 3
}
