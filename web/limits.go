package web

import (
	"context"
	"fmt"
	"strings"
	"time"

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
	overview, err := q.ListLimits(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the limits: %w", err)
	}
	keyRows, err := q.ListConcurrencyKeys(ctx, db.ListConcurrencyKeysParams{MaxRows: maxParkedJobs + 1})
	if err != nil {
		return nil, fmt.Errorf("read sluice.concurrency_keys: %w", err)
	}
	parked, err := q.ListParkedJobs(ctx, db.ListParkedJobsParams{MaxRows: maxParkedJobs + 1})
	if err != nil {
		return nil, fmt.Errorf("read parked jobs: %w", err)
	}

	limits := module.PageTable{
		Caption: "Limits (sluice.concurrency_overview)",
		Columns: []string{"Kind", "Limit", "Per key", "Rate", "Slots in use", "Working", "Waiting in workers", "Parked", "Parked keys", "Oldest parked"},
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
		perKey := text("—")
		if l.KeyMax != nil {
			perKey = text(fmt.Sprintf("%d by %s (%s)", *l.KeyMax, strings.Join(l.PartitionFields, ","), source(l.KeySource)))
		}
		rate := text("—")
		if l.RateMax != nil {
			v := fmt.Sprintf("%d per %s", *l.RateMax, time.Duration(l.RatePeriodMs)*time.Millisecond)
			if l.RatePerKey {
				v += " per " + strings.Join(l.PartitionFields, ",")
			}
			rate = text(fmt.Sprintf("%s, %d in window (%s)", v, l.StartsInWindow, source(l.RateSource)))
		}
		limits.Rows = append(limits.Rows, []module.PageCell{text(l.Kind), limit, perKey, rate, slots, num(l.Working), num(l.Waiting),
			parkedCell, num(l.ParkedKeys), oldest})
	}

	keys := module.PageTable{
		Caption: "Keys with activity (sluice.concurrency_keys, busiest first)",
		Columns: []string{"Kind", "Key", "Per-key limit", "Slots in use", "Parked", "Oldest parked", "Starts in window"},
		Empty:   "No per-key or rate limit holds a job.",
	}
	if len(keyRows) > maxParkedJobs {
		keyRows, keys.Truncated = keyRows[:maxParkedJobs], true
	}
	for _, k := range keyRows {
		limit := text("—")
		if k.MaxPerKey != nil {
			limit = num(*k.MaxPerKey)
		}
		oldest := text("—")
		if k.Parked > 0 {
			oldest = text(Age(seconds(k.OldestParkedSeconds)))
		}
		keys.Rows = append(keys.Rows, []module.PageCell{text(k.Kind), text(k.Key), limit, num(k.SlotsInUse), num(k.Parked), oldest,
			num(k.StartsInWindow)})
	}

	jobs := module.PageTable{
		Caption: "Parked jobs (oldest first within a kind: within a key, the order they resume in)",
		Columns: []string{"Job", "Kind", "Key", "Queue", "State", "Held by", "Parked", "Attempt"},
		Empty:   "No parked jobs.",
	}
	if len(parked) > maxParkedJobs {
		parked, jobs.Truncated = parked[:maxParkedJobs], true
	}
	for _, p := range parked {
		parkedAt := p.ParkedAt
		key := "—"
		if p.Key != nil {
			key = *p.Key
		}
		jobs.Rows = append(jobs.Rows, []module.PageCell{
			jobCell(&p.JobID, fmt.Sprintf("#%d", p.JobID)),
			text(p.Kind),
			text(key),
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
			"A limit N > 0 lets at most N jobs of the kind run at once across all workers; 0 (or no row) is no limit; below 0 is a circuit breaker that parks every job and resumes none. A per-key limit holds per value of its args fields; a rate limits the starts in any window of its period. A parked job is the same River job, pending, resumed in job-id order within its key, round-robin across keys.",
			"Held by: limit (the kind's slots are taken), fifo (older jobs of the kind wait), breaker (circuit breaker), rate (the kind's rate window is full), key_limit, key_fifo, key_rate (the same for its key), migrated (parked before an upgrade). Source: sql (the CLI or SQL, wins) or config (declared in Go).",
		},
		Tables: []module.PageTable{limits, keys, jobs},
	}, nil
}

// limitCells describe a kind's per-kind limit and its slots in use.
func limitCells(l *db.ListLimitsRow) (limit, slots module.PageCell) {
	slots = num(l.Admitted)
	switch {
	case l.MaxConcurrency < 0:
		return statusCell("circuit breaker", "bad"), slots
	case l.MaxConcurrency == 0 && l.MaxSource == nil:
		return text("none"), slots
	case l.MaxConcurrency == 0:
		return text("none (" + source(l.MaxSource) + ")"), slots
	}
	slots.Text = fmt.Sprintf("%d / %d", l.Admitted, l.MaxConcurrency)
	if l.Admitted >= int64(l.MaxConcurrency) {
		slots.Status = "warn"
	}
	return text(fmt.Sprintf("%d (%s)", l.MaxConcurrency, source(l.MaxSource))), slots
}

func source(s *string) string {
	if s == nil {
		return "—"
	}
	return *s
}
