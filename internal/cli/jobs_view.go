package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// jobView is a River job as `sluice jobs list --json` and `jobs show --json`
// print it: River's JobRow with snake_case names, and the parking of a job
// waiting for a concurrency slot.
type jobView struct {
	ID          int64                    `json:"id"`
	Kind        string                   `json:"kind"`
	Queue       string                   `json:"queue"`
	State       string                   `json:"state"`
	Priority    int                      `json:"priority"`
	Attempt     int                      `json:"attempt"`
	MaxAttempts int                      `json:"max_attempts"`
	Tags        []string                 `json:"tags"`
	Args        json.RawMessage          `json:"args"`
	Metadata    json.RawMessage          `json:"metadata"`
	Errors      []rivertype.AttemptError `json:"errors"`
	AttemptedBy []string                 `json:"attempted_by"`
	CreatedAt   time.Time                `json:"created_at"`
	ScheduledAt time.Time                `json:"scheduled_at"`
	AttemptedAt *time.Time               `json:"attempted_at"`
	FinalizedAt *time.Time               `json:"finalized_at"`
	// Parking is set while the job waits parked for a concurrency slot
	// (null otherwise).
	Parking *parkingView `json:"parking"`
	// Waiting is set while the job is running to River but waits in its
	// worker for a concurrency slot: it does no work yet (null otherwise).
	Waiting *waitingView `json:"waiting"`
}

// waitingView is why, since when and in which worker a running job waits
// for a concurrency slot (sluice.waiting_jobs).
type waitingView struct {
	// Reason is what holds it, as a parked job's: limit, fifo, breaker,
	// rate, key_limit, key_fifo or key_rate.
	Reason         string    `json:"reason"`
	WorkerID       string    `json:"worker_id"`
	Since          time.Time `json:"since"`
	WaitingSeconds float64   `json:"waiting_seconds"`
}

// parkingView is why and since when a job waits for a concurrency slot.
type parkingView struct {
	// Reason is limit (no free slot), fifo (older jobs of the kind were
	// waiting), breaker (the limit is a circuit breaker) or migrated
	// (parked by an earlier sluice).
	Reason         string    `json:"reason"`
	ParkedAt       time.Time `json:"parked_at"`
	WaitingSeconds float64   `json:"waiting_seconds"`
	// WorkerID is the worker that parked it (null: migrated).
	WorkerID *string `json:"worker_id"`
	// Position is its place in its kind's line (1: resumed next), of
	// KindParked parked jobs of the kind.
	Position   int64 `json:"position"`
	KindParked int64 `json:"kind_parked"`
	// Limit is the kind's limit (null: none; < 0: circuit breaker) and
	// SlotsTaken its slots in use.
	Limit      *int32 `json:"limit"`
	SlotsTaken int64  `json:"slots_taken"`
}

// newJobView converts a River job row.
func newJobView(j *rivertype.JobRow) *jobView {
	v := &jobView{
		ID: j.ID, Kind: j.Kind, Queue: j.Queue, State: string(j.State), Priority: j.Priority,
		Attempt: j.Attempt, MaxAttempts: j.MaxAttempts, Tags: j.Tags, Args: j.EncodedArgs,
		Metadata: j.Metadata, Errors: j.Errors, AttemptedBy: j.AttemptedBy, CreatedAt: j.CreatedAt,
		ScheduledAt: j.ScheduledAt, AttemptedAt: j.AttemptedAt, FinalizedAt: j.FinalizedAt,
	}
	if v.Tags == nil {
		v.Tags = []string{}
	}
	if v.Errors == nil {
		v.Errors = []rivertype.AttemptError{}
	}
	if v.AttemptedBy == nil {
		v.AttemptedBy = []string{}
	}
	if len(v.Args) == 0 {
		v.Args = json.RawMessage("{}")
	}
	if len(v.Metadata) == 0 {
		v.Metadata = json.RawMessage("{}")
	}
	return v
}

// addParking sets the parking of the jobs that wait for a concurrency slot,
// parked (concurrency_parked_jobs) or running in their worker
// (sluice.waiting_jobs): two statements, however many jobs.
func addParking(ctx context.Context, dbtx db.DBTX, jobs []*jobView) error {
	if len(jobs) == 0 {
		return nil
	}
	ids := make([]int64, len(jobs))
	byID := make(map[int64]*jobView, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
		byID[j.ID] = j
	}
	rows, err := db.New(dbtx).ParkedJobs(ctx, ids)
	if err != nil {
		return fmt.Errorf("read the parking of jobs: %w", err)
	}
	for _, r := range rows {
		if j := byID[r.JobID]; j != nil {
			j.Parking = &parkingView{
				Reason: r.Reason, ParkedAt: r.ParkedAt, WaitingSeconds: r.WaitingSeconds, WorkerID: r.WorkerID,
				Position: r.Position, KindParked: r.KindParked, Limit: r.MaxConcurrency, SlotsTaken: r.SlotsTaken,
			}
		}
	}
	waiting, err := db.New(dbtx).WaitingJobs(ctx, ids)
	if err != nil {
		return fmt.Errorf("read which running jobs wait for a slot: %w", err)
	}
	for _, r := range waiting {
		if j := byID[r.JobID]; j != nil && j.State == string(rivertype.JobStateRunning) {
			j.Waiting = &waitingView{Reason: r.Reason, WorkerID: r.WorkerID, Since: r.Since, WaitingSeconds: r.WaitingSeconds}
		}
	}
	return nil
}

// stateText is a job's state for people: River's, and for a job waiting
// for a concurrency slot, that it is parked, or that it runs but waits in
// its worker.
func (v *jobView) stateText() string {
	switch {
	case v.Parking != nil:
		return v.State + " (parked)"
	case v.Waiting != nil:
		return v.State + " (waiting for a slot)"
	}
	return v.State
}

// describe says why a running job waits in its worker, in words.
func (w *waitingView) describe() string {
	return fmt.Sprintf("waiting in worker %s for a concurrency slot since %s (%s), held by %s (reason %s); it does no work until it has one",
		w.WorkerID, w.Since.UTC().Format(time.RFC3339), roundSecs(w.WaitingSeconds), heldBy(w.Reason), w.Reason)
}

// describe says why a job waits, in words.
func (p *parkingView) describe(kind string) string {
	why := map[string]string{
		"limit":    "no slot was free under the kind's concurrency limit",
		"fifo":     "older jobs of the kind were waiting",
		"breaker":  "the kind's limit is a circuit breaker",
		"migrated": "parked by an earlier version of sluice",
	}[p.Reason]
	if why == "" {
		why = p.Reason
	}
	by := ""
	if p.WorkerID != nil {
		by = " by worker " + *p.WorkerID
	}
	limit := "no limit now (concurrency_limit.resume will make it available)"
	if p.Limit != nil {
		limit = fmt.Sprintf("limit %s, %d slots taken", describeLimit(p.Limit), p.SlotsTaken)
	}
	return fmt.Sprintf("waiting for a concurrency slot since %s (%s)%s: %s (reason %s); %s in line of %d parked %s jobs (resumed in job id order); %s",
		p.ParkedAt.UTC().Format(time.RFC3339), roundSecs(p.WaitingSeconds), by, why, p.Reason,
		ordinal(p.Position), p.KindParked, kind, limit)
}

// ordinal writes n as 1st, 2nd, 3rd, 4th, ….
func ordinal(n int64) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}
