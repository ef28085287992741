package torture

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// The limiter's books at rest: once every job has ended and restTime has
// passed, nothing may be left of the line (slot rows, parked records,
// leased slots, reserved starts, key rows), and each limit row's counts
// equal a recount: nothing works or waits, so anything left is a leak.

// booksSQL reads the limiter's state of the torture kinds.
const booksSQL = `
SELECT
    (SELECT count(*) FROM concurrency_executions WHERE kind LIKE 'torture.%'),
    (SELECT count(*) FROM concurrency_parked_jobs WHERE kind LIKE 'torture.%'),
    (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases WHERE kind LIKE 'torture.%'),
    (SELECT count(*) FROM concurrency_starts WHERE kind LIKE 'torture.%' AND reserved),
    (SELECT count(*) FROM concurrency_key_lines WHERE kind LIKE 'torture.%'),
    (SELECT COALESCE(string_agg(format('%s admitted %s (recount %s), has_parked %s (recount %s)', l.kind, l.admitted,
                 c.n, l.has_parked, c.parked), '; '), '')
     FROM concurrency_limits l
     CROSS JOIN LATERAL (
         SELECT CASE WHEN l.max_concurrency <> 0 THEN
                    (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
                    + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind) END AS n,
                EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = l.kind
                        AND (l.partition_fields IS NULL OR p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))) AS parked
     ) c
     WHERE l.kind LIKE 'torture.%' AND (l.admitted IS DISTINCT FROM c.n OR l.has_parked <> c.parked))`

// lineHistorySQL is the history of the slot and waiter rows of the jobs
// whose slots are left, for diagnosis.
const lineHistorySQL = `
SELECT COALESCE(string_agg(format('job %s: %s reserved=%s worker=%s at %s by %s', l.job_id, l.what, l.reserved, l.worker,
                                  l.at::time, l.query), E'\n' ORDER BY l.id), '')
FROM public.torture_line l
WHERE l.job_id IN (SELECT job_id FROM concurrency_executions WHERE kind LIKE 'torture.%')`

// leftoverSQL describes the slot rows and leases left, for diagnosis.
const leftoverSQL = `
SELECT COALESCE(string_agg(x, '; '), '') FROM (
    SELECT format('slot of job %s (%s key %s, worker %s, reserved %s, since %s; the job %s, attempt %s, finalized %s)',
                  e.job_id, e.kind, e.key, e.worker_id, e.reserved, e.admitted_at::time, j.state, j.attempt, j.finalized_at::time) AS x
    FROM concurrency_executions e LEFT JOIN river_job j ON j.id = e.job_id
    WHERE e.kind LIKE 'torture.%'
    UNION ALL
    SELECT format('lease of %s slots of %s by %s (renewed %s)', cl.slots, cl.kind, cl.worker_id, cl.renewed_at::time)
    FROM concurrency_leases cl WHERE cl.kind LIKE 'torture.%' AND cl.slots > 0
) s`

// checkBooks checks the limiter's books at rest: no slot, parking, lease,
// reservation or key row left, and every limit row's counts equal to a
// recount.
func (x *torture) checkBooks(ctx context.Context) {
	var slots, parked, leased, reserved, keys int64
	var off string
	if err := x.pool.QueryRow(ctx, booksSQL).Scan(&slots, &parked, &leased, &reserved, &keys, &off); err != nil {
		x.vs.add("accounting", "the books at rest could not be read: %v", err)
		return
	}
	if slots+parked+leased+reserved+keys > 0 {
		var rows, history string
		_ = x.pool.QueryRow(ctx, leftoverSQL).Scan(&rows)
		_ = x.pool.QueryRow(ctx, lineHistorySQL).Scan(&history)
		rows += "\n" + history
		x.vs.add("accounting", "at rest, nothing runs or waits, yet %d slot rows, %d parked records, %d leased slots, %d reserved starts, %d key rows are left: %s",
			slots, parked, leased, reserved, keys, rows)
	}
	if off != "" {
		x.vs.add("accounting", "at rest: counts differ from a recount: %s", off)
	}
}

// dump logs the record of every job (TORTURE_DUMP=1), for diagnosis.
func dump(t *testing.T, r *record) {
	var ids []int64
	for id := range r.jobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	r.indexRuns()
	for _, id := range ids {
		var b strings.Builder
		fmt.Fprintf(&b, "job %d (%s key %s):", id, r.jobs[id].kind, r.jobs[id].args.Key)
		for _, c := range r.changes[id] {
			fmt.Fprintf(&b, " %s %s→%s@%s", c.client, c.from, c.to, c.at.Format("05.000000"))
			if at, ok := r.commits[c.tx]; ok && c.to == "running" {
				fmt.Fprintf(&b, " (committed @%s)", at.Format("05.000000"))
			}
			if !c.scheduledAt.IsZero() {
				fmt.Fprintf(&b, " (scheduled %s)", c.scheduledAt.Format("05.000000"))
			}
		}
		for _, e := range r.line[id] {
			fmt.Fprintf(&b, " %s reserved=%t worker=%q@%s tx %d by %.40s;", e.what, e.reserved, e.worker, e.at.Format("05.000000"), e.tx, e.query)
		}
		for _, e := range r.marks[id] {
			fmt.Fprintf(&b, " %s@%s tx %d by %.40s", e.what, e.at.Format("05.000000"), e.tx, e.query)
		}
		for _, x := range r.runsOf[id] {
			fmt.Fprintf(&b, " | run %s %s-%s %s", x.worker, x.start.Format("05.000000"), x.end.Format("05.000000"), x.outcome)
		}
		t.Log(b.String())
	}
}
