package liveness

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
)

// WorkerLostError is the attempt error recorded on each job rescued from a
// dead worker.
func WorkerLostError(workerID string) string {
	return "worker " + workerID + " lost"
}

// RescuedJob is a job RescueWorkerJobs took from a dead worker.
type RescuedJob struct {
	ID   int64
	Kind string
	// State is the job's new state: retryable, discarded or cancelled; or
	// pending, for a job that was being parked (it never ran: the trigger
	// sluice_park_in_place parks it instead).
	State rivertype.JobState
}

// RescueWorkerJobs does to the running jobs of the dead worker workerID
// (those whose current attempt it owns) what River's rescuer
// (internal/maintenance/job_rescuer.go) does to a stuck job, in tx, and
// returns them:
//
//   - a job whose cancellation was requested (metadata.cancel_attempted_at)
//     is cancelled;
//   - a job of a kind this binary does not know is discarded;
//   - otherwise a job with attempts left (attempt < max_attempts; also when
//     its args no longer decode) becomes retryable, and one without is
//     discarded.
//
// Each gets the attempt error "worker <id> lost" and metadata
// river:rescue_count + 1; discarded and cancelled jobs are finalized now.
// Two differences from River's rescuer, both because the worker is known to
// be dead rather than guessed stuck after an hour: a retryable job is due at
// once (scheduled_at now, not after the retry policy's backoff), and no job
// is left alone for not having reached its timeout yet. River's scheduler
// makes a retryable job available (within its 5s interval, on the leader;
// the reap resigns the dead worker's leadership, so that a live worker
// leads at once if the dead one did).
func RescueWorkerJobs(ctx context.Context, tx pgx.Tx, registry *kinds.Registry, workerID string, now time.Time) ([]RescuedJob, error) {
	q := db.New(tx)
	running, err := q.LockWorkerRunningJobs(ctx, workerID)
	if err != nil {
		return nil, fmt.Errorf("lock running jobs of worker %s: %w", workerID, err)
	}
	if len(running) == 0 {
		return nil, nil
	}
	p := db.RescueWorkerJobsParams{WorkerID: workerID}
	for _, job := range running {
		state := rescueState(registry, job)
		errData, err := json.Marshal(rivertype.AttemptError{
			At:      now.UTC(),
			Attempt: max(int(job.Attempt), 0),
			Error:   WorkerLostError(workerID),
			Trace:   "",
		})
		if err != nil {
			return nil, fmt.Errorf("encode attempt error: %w", err)
		}
		p.Ids = append(p.Ids, job.ID)
		p.Errors = append(p.Errors, errData)
		p.States = append(p.States, string(state))
	}
	rows, err := q.RescueWorkerJobs(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("rescue jobs of worker %s: %w", workerID, err)
	}
	out := make([]RescuedJob, len(rows))
	for i, row := range rows {
		out[i] = RescuedJob{ID: row.ID, Kind: row.Kind, State: rivertype.JobState(row.State)}
	}
	return out, nil
}

// rescueState is River's rescue decision for a job whose worker is dead.
func rescueState(registry *kinds.Registry, job *db.LockWorkerRunningJobsRow) rivertype.JobState {
	if cancelAttempted(job.Metadata) {
		return rivertype.JobStateCancelled
	}
	if !registry.Has(job.Kind) {
		// River: "Attempted to rescue unhandled job kind, discarding".
		return rivertype.JobStateDiscarded
	}
	// River retries a job whose args no longer decode too, while it has
	// attempts left; so the decode result does not change the decision.
	if job.Attempt < max(job.MaxAttempts, 0) {
		return rivertype.JobStateRetryable
	}
	return rivertype.JobStateDiscarded
}

// cancelAttempted reports whether metadata records a cancellation request
// (River's JobCancel sets cancel_attempted_at on a running job): a non-zero
// time, or a value that is not a time at all (River's rescuer would fail on
// it; the key's presence is what River's completion looks at).
func cancelAttempted(metadata []byte) bool {
	var m map[string]json.RawMessage
	if len(metadata) == 0 || json.Unmarshal(metadata, &m) != nil {
		return false
	}
	raw, ok := m["cancel_attempted_at"]
	if !ok || string(raw) == "null" {
		return false
	}
	var at time.Time
	if err := json.Unmarshal(raw, &at); err != nil {
		return true
	}
	return !at.IsZero()
}
