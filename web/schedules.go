package web

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
)

// maxSchedules bounds the schedules page.
const maxSchedules = 500

// schedulesPage lists the schedules as sluice.schedule_status shows them.
func schedulesPage() module.Page {
	return module.Page{
		Name:    "schedules",
		Title:   "Schedules",
		Summary: "every schedule: next and last run, health, misfire policy, last job",
		Read:    readSchedules,
	}
}

// scheduleHealthStatus colours the health of sluice.schedule_status.
var scheduleHealthStatus = map[string]string{
	"ok": "ok", "retrying": "warn", "overdue": "bad", "failed": "bad",
}

func readSchedules(ctx context.Context, dbtx db.DBTX) (*module.PageContent, error) {
	q := db.New(dbtx)
	now, err := q.DBNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	rows, err := q.ScheduleStatusList(ctx, maxSchedules+1)
	if err != nil {
		return nil, fmt.Errorf("read sluice.schedule_status: %w", err)
	}
	table := module.PageTable{
		Caption: "Schedules (sluice.schedule_status)",
		Columns: []string{"Name", "Kind", "Cron", "Misfire", "Health", "Next run", "Last run", "Last job", "Runs", "Failures", "Last error"},
		Empty:   "No schedules.",
	}
	if len(rows) > maxSchedules {
		rows, table.Truncated = rows[:maxSchedules], true
	}
	for _, s := range rows {
		health := statusCell(s.Health, scheduleHealthStatus[s.Health])
		if s.OverdueSeconds > 0 {
			health.Title = "due " + Age(seconds(s.OverdueSeconds)) + " ago"
		}
		lastErr := text("")
		if s.LastError != nil {
			lastErr = longCell(*s.LastError, 200)
		}
		next := timeCell(s.NextRunAt)
		if !s.Enabled || s.Status == "failed" {
			next = module.PageCell{Text: "—", Title: "not dispatched while disabled or failed"}
		}
		failures := num(s.FailureCount)
		failures.Text += fmt.Sprintf(" / %d", s.MaxRetries)
		if s.FailureCount > 0 {
			failures.Status = "warn"
		}
		table.Rows = append(table.Rows, []module.PageCell{
			text(s.Name),
			text(s.Kind),
			text(s.Cron + " (" + s.Timezone + ")"),
			text(s.Misfire),
			health,
			next,
			timeCell(s.LastRunAt),
			jobCell(s.LastJobID, jobLabel(s.LastJobID, s.LastJobState)),
			num(s.RunCount),
			failures,
			lastErr,
		})
	}
	return &module.PageContent{
		Now: now,
		Notes: []string{
			"Health: ok; retrying (the last dispatch failed and is retried with backoff); overdue (due longer ago than five dispatcher poll intervals); pending (next run not computed yet); disabled; failed (max_retries consecutive failures: no longer dispatched until enabled again).",
			"Misfire: run_once (missed due times collapse into one run), skip, run_all (backfill, bounded).",
		},
		Tables: []module.PageTable{table},
	}, nil
}

// jobLabel is "#ID state", or "#ID" when the job is gone.
func jobLabel(id *int64, state string) string {
	if id == nil {
		return ""
	}
	if state == "" {
		return fmt.Sprintf("#%d (gone)", *id)
	}
	return fmt.Sprintf("#%d %s", *id, state)
}
