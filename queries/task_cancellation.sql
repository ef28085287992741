-- Cancellation monitoring: the tracker of cancelled running jobs, the
-- cumulative counters per kind and the stats view (task_cancellation.monitor).

-- name: TaskCancellationTracked :one
-- Whether any job is tracked: the monitor's first look, which reads the
-- tracker only (never river_job).
SELECT EXISTS (SELECT 1 FROM task_cancellation_tracker) AS tracked;

-- name: EvictTaskCancellations :many
-- onTaskCompleted, as a safety net: removes tracked rows whose job is no
-- longer running (the untrack trigger on river_job removes them as the job
-- finishes; this catches jobs deleted by hand or finished while the trigger
-- was disabled). One primary-key lookup of river_job per tracked row; rows
-- locked by a concurrent transaction are skipped, so it never waits.
DELETE FROM task_cancellation_tracker
WHERE job_id IN (
    SELECT t.job_id
    FROM task_cancellation_tracker t
    WHERE (SELECT j.state FROM river_job j WHERE j.id = t.job_id) IS DISTINCT FROM 'running'
    FOR UPDATE OF t SKIP LOCKED
)
RETURNING job_id, kind, (counted_at IS NOT NULL)::boolean AS counted;

-- name: CountTaskCancellations :many
-- One monitor pass, in one statement (so one transaction): tracked jobs still
-- running whose cancellation is at least duration_millis old (of the given
-- kinds; none means every kind) and not yet counted are marked counted, and
-- each adds 1 to its kind's total_count_post_cancel. Exactly once: a row is
-- counted only by the UPDATE that finds counted_at still NULL, and rows
-- another monitor holds are skipped (it is counting them). Counter rows are
-- taken in kind order, so concurrent monitors cannot deadlock.
WITH due AS (
    SELECT t.job_id
    FROM task_cancellation_tracker t
    WHERE t.counted_at IS NULL
      AND t.cancelled_at <= now() - sqlc.arg(duration_millis)::bigint * interval '1 millisecond'
      AND (cardinality(sqlc.arg(kinds)::text[]) = 0 OR t.kind = ANY (sqlc.arg(kinds)::text[]))
      AND (SELECT j.state FROM river_job j WHERE j.id = t.job_id) = 'running'
    ORDER BY t.job_id
    FOR UPDATE OF t SKIP LOCKED
),
counted AS (
    UPDATE task_cancellation_tracker t
    SET counted_at = now()
    FROM due
    WHERE t.job_id = due.job_id AND t.counted_at IS NULL
    RETURNING t.job_id, t.kind
),
added AS (
    SELECT c.kind, count(*)::bigint AS jobs, array_agg(c.job_id ORDER BY c.job_id)::bigint[] AS job_ids
    FROM counted c
    GROUP BY c.kind
),
bumped AS (
    INSERT INTO task_cancellation_counters AS tc (kind, total_count_post_cancel)
    SELECT a.kind, a.jobs FROM added a ORDER BY a.kind
    ON CONFLICT (kind) DO UPDATE
    SET total_count_post_cancel = tc.total_count_post_cancel + EXCLUDED.total_count_post_cancel,
        updated_at = now()
    RETURNING tc.kind, tc.total_count_post_cancel
)
SELECT b.kind, a.jobs AS counted, b.total_count_post_cancel, a.job_ids
FROM bumped b
JOIN added a ON a.kind = b.kind
ORDER BY b.kind;

-- name: TaskCancellationStats :many
-- Per kind: current_count_post_cancel (jobs running past the threshold now)
-- and total_count_post_cancel (cumulative), from the view.
SELECT kind, current_count_post_cancel, total_count_post_cancel
FROM task_cancellation_stats
ORDER BY kind;

-- name: TaskCancellationTrackedJobs :many
-- The jobs tracked now (running when their cancellation was requested),
-- the longest-cancelled first, with how long ago and whether counted.
SELECT t.job_id, t.kind, t.cancelled_at, t.counted_at,
       extract(epoch FROM now() - t.cancelled_at)::float8 AS cancelled_seconds_ago
FROM task_cancellation_tracker t
ORDER BY t.cancelled_at, t.job_id
LIMIT sqlc.arg(max_rows);
