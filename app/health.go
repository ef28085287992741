package app

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// Health statuses, after the monitoring-plugin convention (Nagios, Icinga,
// Sensu): the exit code of `sluice health` is their index.
const (
	HealthOK       = "OK"
	HealthWarning  = "WARNING"
	HealthCritical = "CRITICAL"
)

// healthNamesShown bounds the schedule names a report lists.
const healthNamesShown = 20

// WorkerStatus is a worker as sluice.worker_status shows it: Status is
// live, late (missed heartbeats, not dead yet) or dead.
type WorkerStatus = db.WorkerStatusListRow

// healthWorkersShown bounds the workers a report lists.
const healthWorkersShown = 100

// HealthCheck is one line of a health report.
type HealthCheck struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

// HealthReport is what `sluice health` and GET /health report.
type HealthReport struct {
	// Status is the worst status of the checks.
	Status    string        `json:"status"`
	CheckedAt time.Time     `json:"checked_at"`
	Checks    []HealthCheck `json:"checks"`

	DatabaseReachable bool  `json:"database_reachable"`
	LiveWorkers       int64 `json:"live_workers"`
	// StaleWorkers are rows whose heartbeat stopped without a clean
	// shutdown (crashed or stuck workers); reported, not alarming.
	StaleWorkers int64 `json:"stale_workers"`
	// DeadWorkers are stale rows older than their worker's dead-after,
	// that no reaper has reaped yet (WARNING): their jobs and slots wait
	// for a live worker to rescue them.
	DeadWorkers int64 `json:"dead_workers"`
	// Workers lists (up to 100) workers, dead ones first, with their
	// last heartbeat and running jobs.
	Workers []*WorkerStatus `json:"workers"`
	// DispatcherLastTickAgeSeconds is the age of the latest dispatcher
	// tick any live worker reported; nil when none did.
	DispatcherLastTickAgeSeconds *float64 `json:"dispatcher_last_tick_age_seconds"`
	FreshDispatchers             int64    `json:"fresh_dispatchers"`
	StaleDispatchers             int64    `json:"stale_dispatchers"`
	// OverdueAfterSeconds is how late a schedule may be before it counts
	// as overdue (sluice_schedule_overdue_after()).
	OverdueAfterSeconds float64 `json:"overdue_after_seconds"`
	OverdueSchedules    int64   `json:"overdue_schedules"`
	FailedSchedules     int64   `json:"failed_schedules"`
	// OverdueNames and FailedNames list (up to 20) schedules.
	OverdueNames []string `json:"overdue_names"`
	FailedNames  []string `json:"failed_names"`
	// UnservedQueues counts the queues with available jobs that no live
	// worker serves; UnservedQueueNames names (up to 20) of them.
	UnservedQueues     int64    `json:"unserved_queues"`
	UnservedQueueNames []string `json:"unserved_queue_names"`
	// PausedAfterSeconds is how long a queue may stay paused before it
	// counts (the setting health.queue_paused_after; 0: not checked);
	// PausedQueues counts the queues paused longer, PausedQueueNames names
	// (up to 20) of them.
	PausedAfterSeconds float64  `json:"paused_after_seconds"`
	PausedQueues       int64    `json:"paused_queues"`
	PausedQueueNames   []string `json:"paused_queue_names"`
}

// ExitCode is the monitoring-plugin exit code of the report: 0 OK,
// 1 WARNING, 2 CRITICAL.
func (r *HealthReport) ExitCode() int {
	switch r.Status {
	case HealthOK:
		return 0
	case HealthWarning:
		return 1
	default:
		return 2
	}
}

func (r *HealthReport) add(name, status, format string, args ...any) {
	r.Checks = append(r.Checks, HealthCheck{Name: name, Status: status, Message: fmt.Sprintf(format, args...)})
	if rank(status) > rank(r.Status) {
		r.Status = status
	}
}

func rank(status string) int {
	switch status {
	case HealthOK:
		return 0
	case HealthWarning:
		return 1
	default:
		return 2
	}
}

// Summary is the report's first line, in the monitoring-plugin format
// `STATUS: text | perfdata`.
func (r *HealthReport) Summary() string {
	var problems []string
	for _, c := range r.Checks {
		if c.Status != HealthOK {
			problems = append(problems, c.Name+": "+c.Message)
		}
	}
	text := "all checks passed"
	if len(problems) > 0 {
		text = strings.Join(problems, "; ")
	}
	if !r.DatabaseReachable {
		return fmt.Sprintf("%s: %s", r.Status, text)
	}
	age := "U"
	if r.DispatcherLastTickAgeSeconds != nil {
		age = fmt.Sprintf("%.3fs", *r.DispatcherLastTickAgeSeconds)
	}
	return fmt.Sprintf("%s: %s | live_workers=%d stale_workers=%d dead_workers=%d dispatcher_tick_age=%s overdue_schedules=%d failed_schedules=%d unserved_queues=%d paused_queues=%d",
		r.Status, text, r.LiveWorkers, r.StaleWorkers, r.DeadWorkers, age, r.OverdueSchedules, r.FailedSchedules, r.UnservedQueues, r.PausedQueues)
}

// CheckHealth connects to databaseURL and reports the health of the
// workers and schedules, with sluice's objects in schemas. An unreachable
// database is a CRITICAL report, not an error; errors are a malformed URL
// only.
func CheckHealth(ctx context.Context, databaseURL string, schemas pgkit.Schemas) (*HealthReport, error) {
	config, err := pgkit.ParseConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	config.MaxConns = 2
	if _, ok := config.ConnConfig.RuntimeParams["application_name"]; !ok {
		config.ConnConfig.RuntimeParams["application_name"] = "sluice health"
	}
	resolveCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pgkit.UseSchemas(resolveCtx, config, databaseURL, schemas)
	var pool *pgxpool.Pool
	if err == nil {
		pool, err = pgkit.OpenConfig(ctx, config, databaseURL, 5*time.Second)
	}
	if err != nil {
		r := &HealthReport{Status: HealthOK, CheckedAt: time.Now().UTC()}
		r.add("database", HealthCritical, "unreachable: %v", err)
		return r, nil
	}
	defer pool.Close()
	return checkHealth(ctx, pool), nil
}

// checkHealth builds the report on an open pool. The rules:
//   - database: CRITICAL when it does not answer;
//   - workers: CRITICAL when no worker is live (heartbeat younger than three
//     heartbeat intervals);
//   - dead_workers: WARNING when a worker's heartbeat is older than its
//     dead-after and no reaper has reaped it yet;
//   - dispatcher: CRITICAL when no live worker's dispatcher ticked within
//     three (heartbeat + poll) intervals, WARNING when some did and others
//     did not;
//   - overdue_schedules: WARNING when an enabled, active schedule's
//     next_run_at is older than sluice_schedule_overdue_after();
//   - failed_schedules: WARNING when an enabled schedule is failed;
//   - unserved_queues and paused_queues: see checkQueues.
func checkHealth(ctx context.Context, pool *pgxpool.Pool) *HealthReport {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r := &HealthReport{Status: HealthOK, CheckedAt: time.Now().UTC(), OverdueNames: []string{}, FailedNames: []string{},
		Workers: []*WorkerStatus{}, UnservedQueueNames: []string{}, PausedQueueNames: []string{}}
	q := db.New(pool)
	workers, err := q.WorkerHealth(ctx)
	if err != nil {
		r.add("database", HealthCritical, "query failed: %s", oneLineErr(err))
		return r
	}
	schedules, err := q.ScheduleHealth(ctx)
	if err != nil {
		r.add("database", HealthCritical, "query failed: %s", oneLineErr(err))
		return r
	}
	list, err := q.WorkerStatusList(ctx, healthWorkersShown)
	if err != nil {
		r.add("database", HealthCritical, "query failed: %s", oneLineErr(err))
		return r
	}
	r.Workers = list
	r.DatabaseReachable = true
	r.add("database", HealthOK, "reachable")

	r.LiveWorkers, r.StaleWorkers = workers.Live, workers.Stale
	if workers.Live == 0 {
		r.add("workers", HealthCritical, "no live worker (%d stale)", workers.Stale)
	} else {
		r.add("workers", HealthOK, "%d live, %d stale", workers.Live, workers.Stale)
	}
	r.DeadWorkers = workers.Dead
	if workers.Dead > 0 {
		var dead []string
		for _, w := range list {
			if w.Status == "dead" && len(dead) < healthNamesShown {
				dead = append(dead, fmt.Sprintf("%s (heartbeat %.0fs ago, %d running jobs)", w.ID, w.HeartbeatAgeSeconds, w.RunningJobs))
			}
		}
		r.add("dead_workers", HealthWarning, "%d dead, not reaped yet (no live worker has reaped them): %s",
			workers.Dead, listNames(dead, workers.Dead))
	} else {
		r.add("dead_workers", HealthOK, "none")
	}

	r.FreshDispatchers, r.StaleDispatchers = workers.DispatchersFresh, workers.DispatchersStale
	age := "never"
	if workers.LastTickAt != nil {
		secs := workers.DbNow.Sub(*workers.LastTickAt).Seconds()
		r.DispatcherLastTickAgeSeconds = &secs
		age = fmt.Sprintf("%.1fs ago", secs)
	}
	var stale []string
	if workers.DispatchersStale > 0 {
		rows, err := q.StaleDispatchers(ctx, healthNamesShown)
		if err == nil {
			for _, d := range rows {
				since := fmt.Sprintf("never ticked, worker up %.0fs", d.StartedAgeSeconds)
				if d.TickAgeSeconds >= 0 {
					since = fmt.Sprintf("last tick %.0fs ago", d.TickAgeSeconds)
				}
				stale = append(stale, fmt.Sprintf("%s on %s (%s)", d.ID, d.Host, since))
			}
		}
	}
	switch {
	case workers.DispatchersFresh == 0 && len(stale) > 0:
		r.add("dispatcher", HealthCritical, "no live dispatcher has ticked recently: %s", listNames(stale, workers.DispatchersStale))
	case workers.DispatchersFresh == 0 && workers.AnyTickAt != nil:
		// The last tick was a worker's that is no longer live (killed,
		// not reaped yet): name it, and when it ticked.
		r.add("dispatcher", HealthCritical, "no live dispatcher has ticked recently: the last tick was %.1fs ago by %s on %s, which is %s (heartbeat %.0fs ago)",
			workers.DbNow.Sub(*workers.AnyTickAt).Seconds(), workers.AnyTickWorker, workers.AnyTickHost, workers.AnyTickStatus,
			workers.AnyTickHeartbeatAgeSeconds)
	case workers.DispatchersFresh == 0:
		r.add("dispatcher", HealthCritical, "no live dispatcher has ticked recently, and no worker row records a tick (no worker with a dispatcher runs)")
	case workers.DispatchersStale > 0:
		r.add("dispatcher", HealthWarning, "last tick %s; %d of %d live dispatchers have not ticked recently: %s",
			age, workers.DispatchersStale, workers.DispatchersFresh+workers.DispatchersStale, listNames(stale, workers.DispatchersStale))
	default:
		r.add("dispatcher", HealthOK, "last tick %s (%d live dispatchers)", age, workers.DispatchersFresh)
	}

	r.OverdueAfterSeconds = schedules.OverdueAfterSeconds
	r.OverdueSchedules, r.FailedSchedules = schedules.Overdue, schedules.Failed
	if schedules.Overdue > 0 {
		if names, err := q.OverdueScheduleNames(ctx, healthNamesShown); err == nil {
			r.OverdueNames = names
		}
		r.add("overdue_schedules", HealthWarning, "%d due more than %gs ago: %s", schedules.Overdue,
			schedules.OverdueAfterSeconds, listNames(r.OverdueNames, schedules.Overdue))
	} else {
		r.add("overdue_schedules", HealthOK, "none (threshold %gs)", schedules.OverdueAfterSeconds)
	}
	if schedules.Failed > 0 {
		if names, err := q.FailedScheduleNames(ctx, healthNamesShown); err == nil {
			r.FailedNames = names
		}
		r.add("failed_schedules", HealthWarning, "%d failed (`sluice schedule enable NAME` after fixing): %s",
			schedules.Failed, listNames(r.FailedNames, schedules.Failed))
	} else {
		r.add("failed_schedules", HealthOK, "none")
	}
	r.checkQueues(ctx, pool)
	return r
}

func listNames(names []string, total int64) string {
	s := strings.Join(names, ", ")
	if more := total - int64(len(names)); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

func oneLineErr(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// healthHandler serves GET /health: the report as JSON, with status 200
// for OK and WARNING and 503 for CRITICAL.
func healthHandler(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		report := checkHealth(r.Context(), pool)
		status := http.StatusOK
		if report.Status == HealthCritical {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, report)
	}
}
