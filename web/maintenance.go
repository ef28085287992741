package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
)

// maxMaintenanceRuns is how many recent runs the page lists.
const maxMaintenanceRuns = 100

// maintenancePage shows the maintenance runs journal.
func maintenancePage() module.Page {
	return module.Page{
		Name:    "maintenance",
		Title:   "Maintenance runs",
		Summary: "each maintenance kind's latest run and last success, and the latest runs (maintenance_runs)",
		Read:    readMaintenance,
	}
}

// runStatus colours maintenance_runs.status.
var runStatus = map[string]string{"succeeded": "ok", "skipped_locked": "warn", "failed": "bad"}

func readMaintenance(ctx context.Context, dbtx db.DBTX) (*module.PageContent, error) {
	q := db.New(dbtx)
	now, err := q.DBNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	kinds, err := q.MaintenanceKindSummary(ctx)
	if err != nil {
		return nil, fmt.Errorf("read maintenance runs per kind: %w", err)
	}
	runs, err := q.RecentMaintenanceRuns(ctx, maxMaintenanceRuns+1)
	if err != nil {
		return nil, fmt.Errorf("read maintenance runs: %w", err)
	}

	summary := module.PageTable{
		Caption: "Per kind",
		Columns: []string{"Kind", "Latest run", "Started", "Took", "Affected", "Last success", "Job"},
		Empty:   "No maintenance run yet.",
	}
	for _, k := range kinds {
		started := k.LastStartedAt
		success := text("never")
		if k.LastSucceededSecondsAgo >= 0 {
			success = text(Age(seconds(k.LastSucceededSecondsAgo)) + " ago")
		}
		summary.Rows = append(summary.Rows, []module.PageCell{
			text(k.Kind),
			statusCell(k.LastStatus, runStatus[k.LastStatus]),
			{Time: &started},
			took(k.LastStartedAt, k.LastFinishedAt),
			num(k.LastAffected),
			success,
			jobCell(k.LastJobID, ""),
		})
	}

	recent := module.PageTable{
		Caption: "Latest runs",
		Columns: []string{"Run", "Kind", "Status", "Started", "Took", "Affected", "Worker", "Job", "Details"},
		Empty:   "No maintenance run yet.",
	}
	if len(runs) > maxMaintenanceRuns {
		runs, recent.Truncated = runs[:maxMaintenanceRuns], true
	}
	for _, r := range runs {
		started := r.StartedAt
		worker := ""
		if r.WorkerID != nil {
			worker = *r.WorkerID
		}
		recent.Rows = append(recent.Rows, []module.PageCell{
			num(r.ID),
			text(r.Kind),
			statusCell(r.Status, runStatus[r.Status]),
			{Time: &started},
			took(r.StartedAt, r.FinishedAt),
			num(r.Affected),
			text(worker),
			jobCell(r.JobID, ""),
			longCell(compactJSON(r.Details), 200),
		})
	}
	return &module.PageContent{
		Now: now,
		Notes: []string{
			"Each maintenance run holds its kind's advisory lock for the whole run: succeeded, failed, or skipped_locked when another session held the lock (a run of the kind was already going, or an operator paused the kind).",
		},
		Tables: []module.PageTable{summary, recent},
	}, nil
}

// took is how long a finished run took, or "running" for one still going.
func took(started time.Time, finished *time.Time) module.PageCell {
	if finished == nil {
		return text("running")
	}
	return text(Age(finished.Sub(started)))
}

// compactJSON is raw JSON without its spaces (raw itself if it does not
// compact).
func compactJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return string(raw)
	}
	return buf.String()
}
