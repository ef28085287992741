package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/modules/demo"
)

// The exactly-once bookkeeping of the fault scenarios (kill -9 during park
// and resume, a Postgres restart during admission, pool exhaustion).
//
// Each logical job is one river_job row tagged <tag>-<i>: parking keeps the
// row (parking in place), so "exactly once" means each tagged row completed
// once — one change of state to completed in test_audit — by the worker
// that ran its last attempt, and "lost" means a tagged row that never
// completed.

// installAudit records, in test_audit, every change of a River job's state
// and every deletion of a worker row, with the worker of the session that
// made it (its sluice.worker_id) and the database's clock.
func (h *harness) installAudit() {
	h.t.Helper()
	h.exec(`
		CREATE TABLE test_audit (
			seq bigserial PRIMARY KEY,
			at timestamptz NOT NULL DEFAULT clock_timestamp(),
			job_id bigint, old_state text, new_state text, attempt int, owner text,
			deleted_worker text,
			by_worker text DEFAULT current_setting('sluice.worker_id', true));
		CREATE FUNCTION test_audit_job() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO test_audit (job_id, old_state, new_state, attempt, owner)
			VALUES (NEW.id, OLD.state, NEW.state, NEW.attempt, NEW.attempted_by[array_upper(NEW.attempted_by, 1)]);
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_audit_job AFTER UPDATE OF state ON river_job
			FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION test_audit_job();
		CREATE FUNCTION test_audit_worker() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO test_audit (deleted_worker) VALUES (OLD.id);
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_audit_worker AFTER DELETE ON sluice_workers
			FOR EACH ROW EXECUTE FUNCTION test_audit_worker();`)
}

// insertTagged inserts n demo.sleep jobs of ms milliseconds tagged
// <tag>-0 … <tag>-(n-1), in one statement.
func (h *harness) insertTagged(tag string, n, ms int) {
	h.t.Helper()
	require.NoError(h.t, h.insertTaggedFrom(tag, 0, n, ms))
}

// insertTaggedFrom inserts n demo.sleep jobs of ms milliseconds tagged
// <tag>-from … <tag>-(from+n-1), in one statement (from any goroutine).
func (h *harness) insertTaggedFrom(tag string, from, n, ms int) error {
	client, err := app.NewInsertClient(h.pool, nil)
	if err != nil {
		return err
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{
			Args:       demo.SleepArgs{MS: int64(ms)},
			InsertOpts: &river.InsertOpts{Tags: []string{fmt.Sprintf("%s-%d", tag, from+i)}},
		}
	}
	_, err = client.InsertMany(context.Background(), params)
	return err
}

// onceReport is the outcome of the tagged jobs of a scenario.
type onceReport struct {
	// In is how many logical jobs went in.
	In int64
	// DoneOnce counts those completed exactly once: one row, completed,
	// with one change of state to completed.
	DoneOnce int64
	// Lost counts those not completed (no row, or a row not completed).
	Lost int64
	// Twice counts those completed more than once (more rows completed, or
	// one row completed twice).
	Twice int64
}

func (r onceReport) String() string {
	return fmt.Sprintf("jobs in %d, done exactly once %d, lost %d, done more than once %d", r.In, r.DoneOnce, r.Lost, r.Twice)
}

// exactlyOnce reports on the n jobs tagged tag from river_job and test_audit.
func (h *harness) exactlyOnce(tag string, n int) onceReport {
	h.t.Helper()
	r := onceReport{In: int64(n)}
	require.NoError(h.t, h.pool.QueryRow(context.Background(), `
		WITH tags AS (
			SELECT $1 || '-' || i AS tag FROM generate_series(0, $2 - 1) AS i
		), per_tag AS (
			SELECT t.tag,
			       count(j.id) AS rows,
			       count(j.id) FILTER (WHERE j.state = 'completed') AS completed_rows,
			       COALESCE(sum((SELECT count(*) FROM test_audit a WHERE a.job_id = j.id AND a.new_state = 'completed')), 0) AS completions
			FROM tags t
			LEFT JOIN river_job j ON j.kind = 'demo.sleep' AND t.tag = ANY(j.tags)
			GROUP BY t.tag
		)
		SELECT count(*) FILTER (WHERE rows = 1 AND completed_rows = 1 AND completions = 1),
		       count(*) FILTER (WHERE completed_rows = 0),
		       count(*) FILTER (WHERE completed_rows > 1 OR completions > 1)
		FROM per_tag`, tag, n).Scan(&r.DoneOnce, &r.Lost, &r.Twice))
	return r
}

// requireExactlyOnce checks the report, and, from test_audit, that every
// completion was written by the worker that ran the job's last attempt
// (never by a session of another worker) and every job came to completion
// through running.
func (h *harness) requireExactlyOnce(r onceReport) {
	h.t.Helper()
	require.Zero(h.t, r.Lost, "jobs lost: %s", r)
	require.Zero(h.t, r.Twice, "jobs done more than once: %s", r)
	require.Equal(h.t, r.In, r.DoneOnce, "every job done exactly once: %s", r)
	require.Zero(h.t, h.count(`
		SELECT count(*) FROM test_audit
		WHERE new_state = 'completed' AND (old_state <> 'running' OR by_worker IS DISTINCT FROM owner)`),
		"a job completed by another worker than the one running its attempt, or without running")
}

// slotsTakenSQL is the slots taken of demo.sleep: slot rows and leased slots.
const slotsTakenSQL = `SELECT (SELECT count(*) FROM concurrency_executions WHERE kind = 'demo.sleep') + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases WHERE kind = 'demo.sleep')`

// slotCountsOffSQL counts the limit rows whose count of slots taken
// differs from their slot rows and leased slots, in one snapshot.
const slotCountsOffSQL = `
	SELECT count(*) FROM concurrency_limits l
	WHERE l.admitted <> (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
	                   + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind)`

// requireNothingLeft checks that, once every job is done, no job is parked,
// pending or available, the counts of concurrency_limits equal their rows,
// and every slot goes back (leased slots are given back once idle).
func (h *harness) requireNothingLeft() {
	h.t.Helper()
	require.Zero(h.t, h.count(`SELECT count(*) FROM concurrency_parked_jobs`), "no job left parked")
	require.Zero(h.t, h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state <> 'completed'`),
		"no demo.sleep job left pending, available, retryable or running")
	require.Zero(h.t, h.count(slotCountsOffSQL), "slot counts equal the slot rows and leased slots")
	if !assert.Eventually(h.t, func() bool { return h.count(slotsTakenSQL) == 0 }, time.Minute, 100*time.Millisecond) {
		h.t.Fatalf("slots still taken after every job ended:\n%s", h.dump(slotsLeftSQL))
	}
	require.Zero(h.t, h.count(slotCountsOffSQL), "slot counts equal the slot rows and leased slots")
}

// slotsLeftSQL describes the limiter's state of demo.sleep, one line each
// (its limit row, slot rows, leases, and jobs by state), for a failure's
// message.
const slotsLeftSQL = `
	SELECT format('limit: max %s admitted %s', l.max_concurrency, l.admitted) FROM concurrency_limits l WHERE l.kind = 'demo.sleep'
	UNION ALL
	SELECT format('execution: job %s (state %s) worker %s reserved %s admitted %s', e.job_id, j.state, e.worker_id, e.reserved, e.admitted_at)
	FROM concurrency_executions e LEFT JOIN river_job j ON j.id = e.job_id WHERE e.kind = 'demo.sleep'
	UNION ALL
	SELECT format('lease: worker %s slots %s renewed %s', cl.worker_id, cl.slots, cl.renewed_at) FROM concurrency_leases cl WHERE cl.kind = 'demo.sleep'
	UNION ALL
	SELECT format('jobs %s: %s (parked %s)', j.state, count(*), count(p.job_id)) FROM river_job j LEFT JOIN concurrency_parked_jobs p ON p.job_id = j.id
	WHERE j.kind = 'demo.sleep' GROUP BY j.state`

// dump runs a query returning one text column and joins its rows.
func (h *harness) dump(sql string) string {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), sql)
	require.NoError(h.t, err, sql)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(h.t, err, sql)
	return strings.Join(lines, "\n")
}

// workedRE matches a series of sluice_jobs_total.
var workedRE = regexp.MustCompile(`(?m)^sluice_jobs_total\{kind="([^"]+)",outcome="([^"]+)",queue="[^"]*"\} (\S+)$`)

// executions is how many jobs of kind worker w has run (every outcome), as
// its /metrics says: the job metrics sit inside the limiter, so a job that
// parks, or fails admission, is not counted; only a run of the job's own
// code is.
func executions(h *harness, w *proc.Worker, kind string) int64 {
	h.t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + w.Addr + "/metrics")
	require.NoError(h.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	var n int64
	for _, m := range workedRE.FindAllStringSubmatch(string(body), -1) {
		if m[1] != kind {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		require.NoError(h.t, err)
		n += int64(v)
	}
	return n
}

// firstCompletionAfter is how long after t the first job of kind was
// completed (by test_audit), or -1 if none was.
func (h *harness) firstCompletionAfter(t time.Time, kind string) time.Duration {
	h.t.Helper()
	var at *time.Time
	require.NoError(h.t, h.pool.QueryRow(context.Background(), `
		SELECT min(a.at) FROM test_audit a JOIN river_job j ON j.id = a.job_id
		WHERE a.new_state = 'completed' AND a.at > $1 AND j.kind = $2`, t, kind).Scan(&at))
	if at == nil {
		return -1
	}
	return at.Sub(t)
}

// lastCompletion is when the last job of kind was completed (test_audit).
func (h *harness) lastCompletion(kind string) time.Time {
	h.t.Helper()
	var at time.Time
	require.NoError(h.t, h.pool.QueryRow(context.Background(), `
		SELECT max(a.at) FROM test_audit a JOIN river_job j ON j.id = a.job_id
		WHERE a.new_state = 'completed' AND j.kind = $1`, kind).Scan(&at))
	return at
}
