package web

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
)

// maxParkedJobs bounds the parked jobs listed.
const maxParkedJobs = 200

// limitsPage shows the concurrency limits, their slots and parked jobs.
func limitsPage() module.Page {
	return module.Page{
		Name:    "limits",
		Title:   "Concurrency limits",
		Summary: "limits per kind, slots in use, and the jobs parked waiting for one",
		Read:    readLimits,
	}
}

func readLimits(ctx context.Context, dbtx db.DBTX) (*module.PageContent, error) {
	q := db.New(dbtx)
	now, err := q.DBNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	overview, err := q.ConcurrencyOverview(ctx)
	if err != nil {
		return nil, fmt.Errorf("read sluice_concurrency_overview: %w", err)
	}
	parked, err := q.ListParkedJobs(ctx, db.ListParkedJobsParams{MaxRows: maxParkedJobs + 1})
	if err != nil {
		return nil, fmt.Errorf("read parked jobs: %w", err)
	}

	limits := module.PageTable{
		Caption: "Limits (sluice_concurrency_overview)",
		Columns: []string{"Kind", "Limit", "Slots in use", "Parked", "Oldest parked"},
		Empty:   "No limits, and no job holds a slot or is parked.",
	}
	for _, l := range overview {
		limit, slots := limitCells(l)
		parkedCell := num(l.Parked)
		oldest := text("—")
		if l.Parked > 0 {
			parkedCell.Status = "warn"
			oldest = text(Age(seconds(l.OldestParkedSeconds)))
		}
		limits.Rows = append(limits.Rows, []module.PageCell{text(l.Kind), limit, slots, parkedCell, oldest})
	}

	jobs := module.PageTable{
		Caption: "Parked jobs (oldest first within a kind: the order they resume in)",
		Columns: []string{"Job", "Kind", "Queue", "State", "Reason", "Parked", "Attempt"},
		Empty:   "No parked jobs.",
	}
	if len(parked) > maxParkedJobs {
		parked, jobs.Truncated = parked[:maxParkedJobs], true
	}
	for _, p := range parked {
		parkedAt := p.ParkedAt
		jobs.Rows = append(jobs.Rows, []module.PageCell{
			jobCell(&p.JobID, fmt.Sprintf("#%d", p.JobID)),
			text(p.Kind),
			text(p.Queue),
			text(p.State),
			text(p.Reason),
			{Time: &parkedAt},
			text(fmt.Sprintf("%d / %d", p.Attempt, p.MaxAttempts)),
		})
	}
	return &module.PageContent{
		Now: now,
		Notes: []string{
			"A limit N > 0 lets at most N jobs of the kind run at once across all workers; 0 (or no row) is no limit; below 0 is a circuit breaker that parks every job and resumes none. A parked job is the same River job, pending, resumed in job-id order as slots free.",
			"Reason: limit (no slot freed in time), fifo (older jobs of the kind were parked), breaker (the limit is a circuit breaker), migrated (parked before an upgrade).",
		},
		Tables: []module.PageTable{limits, jobs},
	}, nil
}

// limitCells describe a kind's limit and its slots in use.
func limitCells(l *db.ConcurrencyOverviewRow) (limit, slots module.PageCell) {
	slots = num(l.Admitted)
	switch {
	case l.MaxConcurrency == nil:
		return text("none (limit removed)"), slots
	case *l.MaxConcurrency < 0:
		return statusCell("circuit breaker", "bad"), slots
	case *l.MaxConcurrency == 0:
		return text("unlimited"), slots
	}
	slots.Text = fmt.Sprintf("%d / %d", l.Admitted, *l.MaxConcurrency)
	if l.Admitted >= *l.MaxConcurrency {
		slots.Status = "warn"
	}
	return num(*l.MaxConcurrency), slots
}
