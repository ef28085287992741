package web

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
)

// maxWorkers bounds the workers listed.
const maxWorkers = 200

// workersPage lists the workers with their heartbeats.
func workersPage() module.Page {
	return module.Page{
		Name:    "workers",
		Title:   "Workers",
		Summary: "every worker's heartbeat, dispatcher and running jobs (dead ones first)",
		Read:    readWorkers,
	}
}

// workerStatus colours sluice.worker_status.status.
var workerStatus = map[string]string{"live": "ok", "late": "warn", "dead": "bad"}

func readWorkers(ctx context.Context, dbtx db.DBTX) (*module.PageContent, error) {
	q := db.New(dbtx)
	now, err := q.DBNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	rows, err := q.WorkerStatusPage(ctx, maxWorkers+1)
	if err != nil {
		return nil, fmt.Errorf("read sluice.worker_status: %w", err)
	}
	table := module.PageTable{
		Caption: "Workers (sluice.worker_status)",
		Columns: []string{"Worker", "Host", "PID", "Status", "Started", "Heartbeat", "Every / dead after", "Dispatcher", "Running jobs"},
		Empty:   "No workers.",
	}
	if len(rows) > maxWorkers {
		rows, table.Truncated = rows[:maxWorkers], true
	}
	for _, w := range rows {
		started, beat := w.StartedAt, w.HeartbeatAt
		table.Rows = append(table.Rows, []module.PageCell{
			text(w.ID),
			text(w.Host),
			num(w.Pid),
			statusCell(w.Status, workerStatus[w.Status]),
			{Time: &started},
			{Time: &beat},
			text(Age(seconds(w.HeartbeatIntervalSeconds)) + " / " + Age(seconds(w.DeadAfterSeconds))),
			dispatcherCell(w),
			num(w.RunningJobs),
		})
	}
	return &module.PageContent{
		Now: now,
		Notes: []string{
			"A worker is live while it heartbeats every interval, late after three missed heartbeats, and dead once its heartbeat is older than its dead-after: a live worker's reaper then rescues its jobs and frees its slots.",
		},
		Tables: []module.PageTable{table},
	}, nil
}

// dispatcherCell says when the worker's schedule dispatcher last ticked.
func dispatcherCell(w *db.WorkerStatusPageRow) module.PageCell {
	switch {
	case !w.Dispatcher:
		return text("—")
	case w.DispatcherTickAgeSeconds < 0 && w.DispatcherFresh:
		return text("not ticked yet")
	case w.DispatcherTickAgeSeconds < 0:
		return statusCell("stale: never ticked", "bad")
	case w.DispatcherFresh:
		return statusCell("ticked "+Age(seconds(w.DispatcherTickAgeSeconds))+" ago", "ok")
	default:
		return statusCell("stale: ticked "+Age(seconds(w.DispatcherTickAgeSeconds))+" ago", "bad")
	}
}
