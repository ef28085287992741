package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// TrackCancelledJob registers job in the cancellation tracker if it is a
// running job whose cancellation was requested (River's JobCancel stamps
// metadata.cancel_attempted_at on it): the seed's onTaskCancelled. Call it
// through the transaction that cancelled the job (client.JobCancelTx), so
// the job is tracked if and only if the cancellation commits.
//
// The trigger sluice_task_cancellation_track on river_job tracks every such
// job too, whichever client cancels it; this explicit registration makes
// `sluice jobs cancel` independent of it. It reports whether it added a row
// (false when the job was tracked already or is not a running cancelled
// job).
func TrackCancelledJob(ctx context.Context, dbtx db.DBTX, job *rivertype.JobRow) (bool, error) {
	if job.State != rivertype.JobStateRunning {
		return false, nil
	}
	var meta struct {
		CancelAttemptedAt *time.Time `json:"cancel_attempted_at"`
	}
	if err := json.Unmarshal(job.Metadata, &meta); err != nil || meta.CancelAttemptedAt == nil {
		// Not a cancellation River stamped: nothing to track.
		return false, nil //nolint:nilerr // unreadable metadata means "not cancelled"
	}
	n, err := db.New(dbtx).TrackCancelledJob(ctx, db.TrackCancelledJobParams{
		JobID:       job.ID,
		Kind:        job.Kind,
		CancelledAt: *meta.CancelAttemptedAt,
	})
	if err != nil {
		return false, fmt.Errorf("track cancelled job %d: %w", job.ID, err)
	}
	return n > 0, nil
}
