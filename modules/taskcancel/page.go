package taskcancel

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/settings"
)

// maxTrackedShown bounds the tracked jobs the page lists.
const maxTrackedShown = 200

// page is the module's web page: the monitor's settings and counters per
// kind, and the jobs tracked now.
func page() module.Page {
	return module.Page{
		Name:    "cancellations",
		Title:   "Cancellation monitor",
		Summary: "jobs still running after their cancellation, per kind, and the cancelled jobs tracked now",
		Read:    readPage,
	}
}

func readPage(ctx context.Context, dbtx db.DBTX) (*module.PageContent, error) {
	q := db.New(dbtx)
	now, err := q.DBNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	settings, err := ReadTaskCancellationSettings(ctx, settings.New(dbtx))
	if err != nil {
		return nil, err
	}
	stats, err := ReadTaskCancellationStats(ctx, q)
	if err != nil {
		return nil, err
	}
	tracked, err := q.TaskCancellationTrackedJobs(ctx, maxTrackedShown+1)
	if err != nil {
		return nil, fmt.Errorf("read task_cancellation_tracker: %w", err)
	}

	monitor := "enabled"
	if !settings.Enabled {
		monitor = "disabled (task_cancellation.enabled is false: jobs are tracked, not counted)"
	}
	which := "every kind"
	if len(settings.Kinds) > 0 {
		which = "the kinds " + strings.Join(settings.Kinds, ", ")
	}
	notes := []string{
		fmt.Sprintf("The monitor (task_cancellation.monitor) is %s. It counts, once each, the jobs of %s still running %s or longer after their cancellation (task_cancellation.duration_millis).",
			monitor, which, settings.Duration()),
		"Current: jobs running past that threshold right now. Total: every job counted so far (cumulative).",
	}

	perKind := module.PageTable{
		Caption: "Per kind (sluice.task_cancellation_stats)",
		Columns: []string{"Kind", "Current", "Total"},
		Empty:   "No job has kept running after its cancellation.",
	}
	kinds := make([]string, 0, len(stats))
	for kind := range stats {
		kinds = append(kinds, kind)
	}
	sort.Strings(kinds)
	for _, kind := range kinds {
		s := stats[kind]
		current := module.PageCell{Text: fmt.Sprint(s.CurrentCountPostCancel)}
		if s.CurrentCountPostCancel > 0 {
			current.Status = "warn"
		}
		perKind.Rows = append(perKind.Rows, []module.PageCell{{Text: kind}, current, {Text: fmt.Sprint(s.TotalCountPostCancel)}})
	}

	jobs := module.PageTable{
		Caption: "Tracked jobs (task_cancellation_tracker: cancelled while running, still running)",
		Columns: []string{"Job", "Kind", "Cancelled", "Counted"},
		Empty:   "No cancelled job is running.",
	}
	if len(tracked) > maxTrackedShown {
		tracked, jobs.Truncated = tracked[:maxTrackedShown], true
	}
	for _, t := range tracked {
		cancelled := t.CancelledAt
		counted := module.PageCell{Text: "not yet"}
		if t.CountedAt != nil {
			counted = module.PageCell{Time: t.CountedAt, Status: "warn"}
		}
		jobs.Rows = append(jobs.Rows, []module.PageCell{
			{JobID: t.JobID},
			{Text: t.Kind},
			{Time: &cancelled},
			counted,
		})
	}
	return &module.PageContent{Now: now, Notes: notes, Tables: []module.PageTable{perKind, jobs}}, nil
}
