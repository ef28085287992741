package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// listJSON runs `sluice jobs list --json args...` and decodes the jobs.
func listJSON(t *testing.T, url string, args ...string) []jobView {
	t.Helper()
	code, stdout, stderr := runCLI(t, append([]string{"--database-url", url, "jobs", "list", "--json"}, args...)...)
	require.Equal(t, 0, code, stderr)
	var jobs []jobView
	require.NoError(t, json.Unmarshal([]byte(stdout), &jobs), stdout)
	return jobs
}

func ids(jobs []jobView) []int64 {
	out := make([]int64, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}

// TestJobsList: River's JobList with the filters, newest first, as a table
// and as JSON.
func TestJobsList(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	a := enqueueID(t, url, "demo.sleep", "--args", `{"ms": 1}`, "--in", "1h")
	b := enqueueID(t, url, "demo.sleep", "--queue", "emails", "--priority", "3", "--tags", "nightly,batch-7")
	c := enqueueID(t, url, "ci.drop_canceling_builds", "--in", "1h")

	require.Equal(t, []int64{b, a}, ids(listJSON(t, url)), "newest first, sluice's own housekeeping jobs left out")
	require.Equal(t, []int64{c, b, a}, ids(listJSON(t, url, "--all")), "--all: sluice's own too")
	require.Equal(t, []int64{c}, ids(listJSON(t, url, "--kind", "ci.drop_canceling_builds")))
	require.Equal(t, []int64{c, a}, ids(listJSON(t, url, "--all", "--state", "scheduled")))
	require.Equal(t, []int64{c, b, a}, ids(listJSON(t, url, "--all", "--state", "available", "--state", "scheduled")))
	require.Equal(t, []int64{c, b, a}, ids(listJSON(t, url, "--all", "--state", "available,scheduled")))
	require.Empty(t, listJSON(t, url, "--state", "completed"))
	require.Equal(t, []int64{b, a}, ids(listJSON(t, url, "--kind", "demo.sleep")))
	require.Equal(t, []int64{b}, ids(listJSON(t, url, "--kind", "demo.sleep", "--limit", "1")))
	require.Equal(t, []int64{c}, ids(listJSON(t, url, "--queue", "maintenance")))

	jobs := listJSON(t, url, "--queue", "emails")
	require.Len(t, jobs, 1)
	got := jobs[0]
	require.Equal(t, "demo.sleep", got.Kind)
	require.Equal(t, "available", got.State)
	require.Equal(t, 3, got.Priority)
	require.Equal(t, []string{"nightly", "batch-7"}, got.Tags)
	require.Nil(t, got.Parking)

	code, stdout, stderr := runCLI(t, "--database-url", url, "jobs", "list", "--all")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 4, stdout)
	require.Regexp(t, `^ID\s+KIND\s+QUEUE\s+STATE\s+ATTEMPT\s+PRIORITY\s+SCHEDULED AT\s+ARGS$`, lines[0])
	require.Regexp(t, fmt.Sprintf(`^%d\s+demo\.sleep\s+emails\s+available\s+0/25\s+3\s+\S+\s+\{`, b), lines[2])
}

// TestJobsShow prints every field of a job, the error of each attempt (with
// a panic's trace) and, as JSON, River's row with snake_case names.
func TestJobsShow(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	id := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 5}`, 2, 5, []string{"w1", "w2"}, `{"note": "x"}`, "retryable")
	_, err := pool.Exec(context.Background(), `UPDATE river_job SET errors = ARRAY[
		'{"at": "2026-01-02T03:04:05Z", "attempt": 1, "error": "boom", "trace": ""}',
		'{"at": "2026-01-02T03:05:05Z", "attempt": 2, "error": "panic: nil map", "trace": "goroutine 1\nmain.go:7"}']::jsonb[]
		WHERE id = $1`, id)
	require.NoError(t, err)

	code, stdout, stderr := runCLI(t, "--database-url", url, "jobs", "show", strconv.FormatInt(id, 10))
	require.Equal(t, 0, code, stderr)
	for _, want := range []string{
		`(?m)^id:\s+` + strconv.FormatInt(id, 10) + `$`,
		`(?m)^kind:\s+demo\.sleep$`,
		`(?m)^state:\s+retryable$`,
		`(?m)^attempt:\s+2 of 5$`,
		`(?m)^attempted by:\s+w1, w2$`,
		`(?m)^args:\s+\{"ms": 5\}$`,
		`(?m)^metadata:\s+\{"note": "x"\}$`,
		`(?m)^errors:\s+2$`,
		`(?m)^  attempt 1 at 2026-01-02T03:04:05Z: boom$`,
		`(?m)^  attempt 2 at 2026-01-02T03:05:05Z: panic: nil map\n      goroutine 1\n      main\.go:7$`,
	} {
		require.Regexp(t, want, stdout)
	}
	require.NotContains(t, stdout, "parking:")

	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "show", strconv.FormatInt(id, 10), "--json")
	require.Equal(t, 0, code, stderr)
	var v jobView
	require.NoError(t, json.Unmarshal([]byte(stdout), &v))
	require.Equal(t, id, v.ID)
	require.Equal(t, 2, v.Attempt)
	require.Equal(t, 5, v.MaxAttempts)
	require.Len(t, v.Errors, 2)
	require.Equal(t, "boom", v.Errors[0].Error)
	require.JSONEq(t, `{"note": "x"}`, string(v.Metadata))
	require.Nil(t, v.Parking)
}

// TestJobsActOnMany: retry, cancel and delete act on every valid id,
// report each, and exit 1 naming the ids with no job.
func TestJobsActOnMany(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	a := enqueueID(t, url, "demo.sleep", "--in", "1h")
	b := enqueueID(t, url, "demo.sleep", "--in", "1h")
	sa, sb := strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)

	code, stdout, stderr := runCLI(t, "--database-url", url, "jobs", "cancel", sa, "987654321", sb, sa)
	require.Equal(t, 1, code, stdout)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) cancelled\njob %d (demo.sleep) cancelled\n", a, b), stdout)
	require.Equal(t, "sluice: no job with id 987654321\n", stderr)
	require.Equal(t, "cancelled", jobtest.JobState(t, pool, a))
	require.Equal(t, "cancelled", jobtest.JobState(t, pool, b))

	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "cancel", sa)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) already cancelled: left as it is\n", a), stdout)

	// River's JobRetry makes a finished job available again, with one more
	// attempt when it had none left.
	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "retry", sa, "987654321", "987654322")
	require.Equal(t, 1, code, stdout)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) retried: available now (was cancelled; attempt 0 of 25)\n", a), stdout)
	require.Equal(t, "sluice: no jobs with ids 987654321, 987654322\n", stderr)
	require.Equal(t, "available", jobtest.JobState(t, pool, a))

	// A running job: retry leaves it, delete is refused (exit 1), the
	// others are deleted all the same.
	running := insertRunningJob(t, url, "demo.sleep")
	sr := strconv.FormatInt(running, 10)
	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "retry", sr)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) is running: left as it is\n", running), stdout)
	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "delete", sa, sr, sb, "--json")
	require.Equal(t, 1, code, stdout)
	require.Equal(t, fmt.Sprintf("sluice: not deleted: %d\n", running), stderr)
	var outcomes []jobOutcome
	require.NoError(t, json.Unmarshal([]byte(stdout), &outcomes), stdout)
	require.Equal(t, []string{"deleted", "refused", "deleted"}, []string{outcomes[0].Result, outcomes[1].Result, outcomes[2].Result})
	require.Contains(t, outcomes[1].Message, "is running: not deleted")
	require.NotContains(t, stdout, `"state":""`, "a deleted job has no state: it says the one it was deleted in")
	require.NotEmpty(t, outcomes[0].WasState)
	require.Equal(t, "running", outcomes[1].State)
	require.Equal(t, "", jobtest.JobState(t, pool, a))
	require.Equal(t, "", jobtest.JobState(t, pool, b))
	require.Equal(t, "running", jobtest.JobState(t, pool, running))

	code, _, stderr = runCLI(t, "--database-url", url, "jobs", "show", sa)
	require.Equal(t, 1, code)
	require.Equal(t, fmt.Sprintf("sluice: no job with id %d\n", a), stderr)
}

// TestJobsOnParkedJobs: jobs held by a concurrency limit (a circuit
// breaker: parked by a real worker) are shown with their parking, and
// retry, cancel and delete act on each as River documents, on the same
// row: a retried job parks again without an attempt and, once the limit is
// lifted, runs exactly once; a cancelled one never runs; a deleted one is
// gone with its parking record.
func TestJobsOnParkedJobs(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", -1)
	w := proc.StartWorker(t, url, "parker", "--fetch-poll-interval", "200ms")
	a := enqueueID(t, url, "demo.sleep", "--args", `{"ms": 1}`)
	b := enqueueID(t, url, "demo.sleep", "--args", `{"ms": 1}`)
	c := enqueueID(t, url, "demo.sleep", "--args", `{"ms": 1}`)
	jobtest.WaitParked(t, pool, a, b, c)

	parked := listJSON(t, url, "--state", "pending")
	require.Equal(t, []int64{c, b, a}, ids(parked), "River lists parked jobs as pending")
	for _, j := range parked {
		require.NotNil(t, j.Parking, "job %d", j.ID)
		require.Equal(t, "breaker", j.Parking.Reason)
		require.Equal(t, int64(3), j.Parking.KindParked)
	}
	code, stdout, stderr := runCLI(t, "--database-url", url, "jobs", "show", strconv.FormatInt(b, 10))
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^state:\s+pending \(parked\)$`, stdout)
	require.Regexp(t, `(?m)^parking:\s+waiting for a concurrency slot since \S+ \(\S+\) by worker parker: the kind's limit is a circuit breaker \(reason breaker\); 2nd in line of 3 parked demo\.sleep jobs \(resumed in job id order\); limit -1 \(circuit breaker\), 0 slots taken$`, stdout)
	require.Regexp(t, `(?m)^attempt:\s+0 of 25$`, stdout, "parking is not an attempt")

	// Retry: available at once, its record gone; fetched again, it parks
	// again behind the breaker, the same row, still no attempt.
	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "retry", strconv.FormatInt(a, 10))
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) retried: available now (was pending; attempt 0 of 25)\n", a), stdout)
	jobtest.WaitParked(t, pool, a)
	require.Equal(t, 0, jobtest.Count(t, pool, `SELECT attempt FROM river_job WHERE id = $1`, a))

	// Cancel: cancelled at once, never run, its record gone.
	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "cancel", strconv.FormatInt(b, 10))
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) cancelled\n", b), stdout)
	require.Equal(t, "cancelled", jobtest.JobState(t, pool, b))

	// Delete: the row and its record are gone.
	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "delete", strconv.FormatInt(c, 10))
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) deleted (was pending)\n", c), stdout)
	require.Equal(t, "", jobtest.JobState(t, pool, c))
	require.Equal(t, 1, jobtest.Count(t, pool, `SELECT count(*) FROM concurrency_parked_jobs`), "only the retried job waits")

	// Lifted (and resumed now rather than at the next minute): the retried
	// job runs once, the cancelled one never.
	code, _, stderr = runCLI(t, "--database-url", url, "limits", "clear", "demo.sleep")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, "--database-url", url, "run", "concurrency_limit.resume", "--args", `{"kind": "demo.sleep"}`)
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool { return jobtest.JobState(t, pool, a) == "completed" }, 30*time.Second, 20*time.Millisecond, w.Log())
	require.Equal(t, 1, jobtest.Count(t, pool, `SELECT attempt FROM river_job WHERE id = $1`, a), "run exactly once")
	require.Equal(t, 0, jobtest.Count(t, pool, `SELECT attempt FROM river_job WHERE id = $1`, b), "never run")
	require.Equal(t, "cancelled", jobtest.JobState(t, pool, b))
}

// shipArgs and shipWorker are an application's own kind, as a program on
// package sluice registers it.
type shipArgs struct {
	Order int `json:"order"`
}

func (shipArgs) Kind() string { return "shop.ship" }

type shipWorker struct{ river.WorkerDefaults[shipArgs] }

func (shipWorker) Work(context.Context, *river.Job[shipArgs]) error { return nil }

// TestJobsOwnKinds: the jobs commands work on an application's own kinds
// (sluice.Config.Workers), and filter by the kinds the program knows.
func TestJobsOwnKinds(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	workers := river.NewWorkers()
	river.AddWorker(workers, &shipWorker{})
	prog := app.Config{Workers: workers}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := Run(context.Background(), prog, append([]string{"--database-url", url}, args...), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, stdout, stderr := run("enqueue", "shop.ship", "--args", `{"order": 7}`, "--queue", "shipping", "--in", "1h")
	require.Equal(t, 0, code, stderr)
	id := strings.TrimSpace(stdout)

	code, stdout, stderr = run("jobs", "list", "--kind", "shop.ship")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^`+id+`\s+shop\.ship\s+shipping\s+scheduled\s+0/25\s+1\s+\S+\s+\{"order": 7\}$`, stdout)
	// A kind this program does not know is listed all the same (River's
	// JobList takes any kind), with a note.
	code, stdout, stderr = run("jobs", "list", "--kind", "demo.sleep")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, `note: "demo.sleep" is not a kind this program knows`)
	require.NotContains(t, stdout, "shop.ship")
	code, _, stderr = run("jobs", "list", "--kind", "two words")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `invalid --kind "two words"`)

	code, stdout, stderr = run("jobs", "show", id)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^kind:\s+shop\.ship$`, stdout)

	code, stdout, stderr = run("jobs", "retry", id)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "job "+id+" (shop.ship) retried: available now (was scheduled; attempt 0 of 25)\n", stdout)
	code, stdout, stderr = run("jobs", "cancel", id)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "job "+id+" (shop.ship) cancelled\n", stdout)
	code, stdout, stderr = run("jobs", "delete", id)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "job "+id+" (shop.ship) deleted (was cancelled)\n", stdout)
	require.Zero(t, jobtest.Count(t, pool, `SELECT count(*) FROM river_job`))
}
