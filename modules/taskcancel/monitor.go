package taskcancel

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/settings"
)

// Dynamic settings of task_cancellation.monitor and their defaults (the
// seed's task_cancellation.* settings). Migration 00006 inserts the same
// defaults.
const (
	// SettingTaskCancellationEnabled turns the monitor on or off; off, its
	// runs return at once.
	SettingTaskCancellationEnabled = "task_cancellation.enabled"
	// DefaultTaskCancellationEnabled is the default of
	// SettingTaskCancellationEnabled.
	DefaultTaskCancellationEnabled = true
	// SettingTaskCancellationDurationMillis is how long a job must keep
	// running after its cancellation to be counted, in milliseconds.
	SettingTaskCancellationDurationMillis = "task_cancellation.duration_millis"
	// DefaultTaskCancellationDurationMillis is the default of
	// SettingTaskCancellationDurationMillis.
	DefaultTaskCancellationDurationMillis = 10_000
	// MaxTaskCancellationDurationMillis caps
	// SettingTaskCancellationDurationMillis (366 days).
	MaxTaskCancellationDurationMillis = 366 * 24 * 60 * 60 * 1000
	// SettingTaskCancellationKinds lists the job kinds the monitor counts; an
	// empty list counts every kind.
	SettingTaskCancellationKinds = "task_cancellation.kinds"
)

// DefaultTaskCancellationKinds is the default of SettingTaskCancellationKinds:
// every kind.
func DefaultTaskCancellationKinds() []string { return []string{} }

// TaskCancellationMonitorKind is the River job kind of the monitor.
const TaskCancellationMonitorKind = "task_cancellation.monitor"

// TaskCancellationMonitorArgs are the (empty) args of
// task_cancellation.monitor.
type TaskCancellationMonitorArgs struct{}

// Kind is the River job kind.
func (TaskCancellationMonitorArgs) Kind() string { return TaskCancellationMonitorKind }

// Validate accepts the empty args.
func (TaskCancellationMonitorArgs) Validate() error { return nil }

// InsertOpts puts the monitor on the maintenance queue, so that jobs that
// ignore cancellation and hold the default queue's slots — what it monitors
// — cannot starve it, and makes one attempt only: a failed run is not
// retried, the next scheduled run (5 s later) simply tries again.
func (TaskCancellationMonitorArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: maintenance.Queue, MaxAttempts: 1}
}

// TaskCancellationMonitorWorker works task_cancellation.monitor: it counts
// jobs still running long after their cancellation (Monitor.Pass).
//
// It is a periodic monitor, not a maintenance run: it takes no advisory lock
// and writes no maintenance_runs row (one row every 5 s would bury the
// journal). Concurrent runs are safe without a lock: each job is counted by
// exactly one conditional UPDATE, in the transaction that adds it to its
// kind's counter.
type TaskCancellationMonitorWorker struct {
	river.WorkerDefaults[TaskCancellationMonitorArgs]
	monitor    *Monitor
	jobTimeout time.Duration
}

// Timeout is the client's job timeout; a run takes milliseconds.
func (w *TaskCancellationMonitorWorker) Timeout(*river.Job[TaskCancellationMonitorArgs]) time.Duration {
	return w.jobTimeout
}

// Work runs one monitor pass. An error is logged and returned: the job is
// discarded after its one attempt and the next scheduled run tries again.
//
// A run deletes the earlier completed runs (queries/housekeeping.sql): one
// every 5 seconds leaves one completed job, not 60 in 5 minutes among the
// user's jobs.
func (w *TaskCancellationMonitorWorker) Work(ctx context.Context, job *river.Job[TaskCancellationMonitorArgs]) error {
	if _, err := w.monitor.Pass(ctx); err != nil {
		w.monitor.logger.Warn("task cancellation monitor failed; the next run tries again",
			"job_id", job.ID, "error", err)
		return err
	}
	if _, err := w.monitor.queries.DeleteEarlierRuns(ctx, db.DeleteEarlierRunsParams{
		Kind: job.Kind, BeforeID: job.ID, Args: job.EncodedArgs}); err != nil {
		w.monitor.logger.Warn("task cancellation monitor: earlier runs not deleted", "job_id", job.ID, "error", err)
	}
	return nil
}

// Monitor runs the passes of the cancellation monitor.
type Monitor struct {
	queries  *db.Queries
	settings *settings.Settings
	logger   *slog.Logger
}

// NewMonitor returns a monitor on pool.
func NewMonitor(pool *pgxpool.Pool, logger *slog.Logger) *Monitor {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Monitor{queries: db.New(pool), settings: settings.New(pool), logger: logger}
}

// TaskCancellationPass is what one monitor pass did.
type TaskCancellationPass struct {
	// Skipped says why the pass returned without looking at river_job:
	// "disabled" or "nothing tracked"; empty when it looked.
	Skipped string
	// Evicted is the number of tracked rows removed because their job no
	// longer runs.
	Evicted int
	// Counted is the number of jobs counted by this pass, per kind.
	Counted map[string]int64
	// CountedJobIDs are the ids of the jobs this pass counted.
	CountedJobIDs []int64
}

// Reasons a pass skips its work.
const (
	TaskCancellationSkippedDisabled = "disabled"
	TaskCancellationSkippedEmpty    = "nothing tracked"
)

// Pass is one pass of the cancellation monitor (the
// seed's doRun):
//
//  1. if task_cancellation.enabled is false, or no job is tracked, return at
//     once — river_job is not queried;
//  2. remove tracked rows whose job no longer runs (onTaskCompleted's
//     safety net: the river_job trigger normally removes them already);
//  3. in one statement, mark each tracked job that is still running, was
//     cancelled at least task_cancellation.duration_millis ago, is of a kind
//     in task_cancellation.kinds (empty: any) and is not yet counted as
//     counted, and add it to its kind's total_count_post_cancel.
//
// A job is counted at most once, whatever the number of concurrent passes.
func (m *Monitor) Pass(ctx context.Context) (*TaskCancellationPass, error) {
	pass := &TaskCancellationPass{Counted: map[string]int64{}}
	enabled, err := m.settings.Bool(ctx, SettingTaskCancellationEnabled, DefaultTaskCancellationEnabled)
	if err != nil {
		return nil, err
	}
	if !enabled {
		pass.Skipped = TaskCancellationSkippedDisabled
		return pass, nil
	}
	tracked, err := m.queries.TaskCancellationTracked(ctx)
	if err != nil {
		return nil, fmt.Errorf("look at the cancellation tracker: %w", err)
	}
	if !tracked {
		pass.Skipped = TaskCancellationSkippedEmpty
		return pass, nil
	}
	durationMillis, err := readTaskCancellationDuration(ctx, m.settings)
	if err != nil {
		return nil, err
	}
	kinds, err := readTaskCancellationKinds(ctx, m.settings)
	if err != nil {
		return nil, err
	}

	evicted, err := m.queries.EvictTaskCancellations(ctx)
	if err != nil {
		return nil, fmt.Errorf("evict finished jobs from the cancellation tracker: %w", err)
	}
	pass.Evicted = len(evicted)
	if len(evicted) > 0 {
		ids := make([]int64, len(evicted))
		for i, e := range evicted {
			ids[i] = e.JobID
		}
		m.logger.Info("jobs no longer running removed from the cancellation tracker", "job_ids", ids)
	}

	rows, err := m.queries.CountTaskCancellations(ctx, db.CountTaskCancellationsParams{
		DurationMillis: durationMillis, Kinds: kinds,
	})
	if err != nil {
		return nil, fmt.Errorf("count jobs running after cancellation: %w", err)
	}
	for _, r := range rows {
		pass.Counted[r.Kind] = r.Counted
		pass.CountedJobIDs = append(pass.CountedJobIDs, r.JobIds...)
		m.logger.Warn("jobs still running after cancellation counted",
			"kind", r.Kind, "counted", r.Counted, "total_count_post_cancel", r.TotalCountPostCancel,
			"job_ids", r.JobIds, "duration_millis", durationMillis)
	}
	return pass, nil
}

// TaskCancellationSettings are the monitor's dynamic settings.
type TaskCancellationSettings struct {
	// Enabled is task_cancellation.enabled.
	Enabled bool
	// DurationMillis is task_cancellation.duration_millis.
	DurationMillis int64
	// Kinds is task_cancellation.kinds; empty means every kind.
	Kinds []string
}

// Duration is DurationMillis as a duration.
func (s *TaskCancellationSettings) Duration() time.Duration {
	return time.Duration(s.DurationMillis) * time.Millisecond
}

// ReadTaskCancellationSettings reads and checks the monitor's settings; a
// value of the wrong type or out of range is an error naming its key.
func ReadTaskCancellationSettings(ctx context.Context, settings *settings.Settings) (*TaskCancellationSettings, error) {
	enabled, err := settings.Bool(ctx, SettingTaskCancellationEnabled, DefaultTaskCancellationEnabled)
	if err != nil {
		return nil, err
	}
	durationMillis, err := readTaskCancellationDuration(ctx, settings)
	if err != nil {
		return nil, err
	}
	kinds, err := readTaskCancellationKinds(ctx, settings)
	if err != nil {
		return nil, err
	}
	return &TaskCancellationSettings{Enabled: enabled, DurationMillis: durationMillis, Kinds: kinds}, nil
}

func readTaskCancellationDuration(ctx context.Context, settings *settings.Settings) (int64, error) {
	ms, err := settings.Int(ctx, SettingTaskCancellationDurationMillis, DefaultTaskCancellationDurationMillis)
	if err != nil {
		return 0, err
	}
	if ms < 0 || ms > MaxTaskCancellationDurationMillis {
		return 0, fmt.Errorf("setting %s: want an integer between 0 and %d, got %d",
			SettingTaskCancellationDurationMillis, int64(MaxTaskCancellationDurationMillis), ms)
	}
	return ms, nil
}

func readTaskCancellationKinds(ctx context.Context, settings *settings.Settings) ([]string, error) {
	kinds, err := settings.Strings(ctx, SettingTaskCancellationKinds, DefaultTaskCancellationKinds())
	if err != nil {
		return nil, err
	}
	if kinds == nil {
		kinds = []string{}
	}
	return kinds, nil
}
