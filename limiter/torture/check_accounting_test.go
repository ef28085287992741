package torture

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sampleSQL reads the limiter's count of the torture kinds' slots, all in
// one snapshot: the time after it (clock_timestamp(), read as the query
// runs, after its snapshot was taken), each limit row's count (admitted,
// kept under a per-kind limit), the slot rows and leased slots it stands
// for, and per key the slot rows and the key's count (its row in
// concurrency_key_lines).
const sampleSQL = `
SELECT clock_timestamp(),
       COALESCE((SELECT json_object_agg(kind, admitted) FROM concurrency_limits
                 WHERE kind LIKE 'torture.%' AND admitted IS NOT NULL), '{}'),
       COALESCE((SELECT json_object_agg(kind, n) FROM (
           SELECT kind, sum(n) AS n FROM (
               SELECT kind, count(*) AS n FROM concurrency_executions WHERE kind LIKE 'torture.%' GROUP BY kind
               UNION ALL
               SELECT kind, sum(slots) FROM concurrency_leases WHERE kind LIKE 'torture.%' GROUP BY kind
           ) s GROUP BY kind) k), '{}'),
       COALESCE((SELECT json_object_agg(kind, keys) FROM (
           SELECT kind, json_object_agg(key, n) AS keys FROM (
               SELECT kind, key, count(*) AS n FROM concurrency_executions
               WHERE kind LIKE 'torture.%' AND key IS NOT NULL GROUP BY kind, key
           ) e GROUP BY kind) k), '{}'),
       COALESCE((SELECT json_object_agg(kind, keys) FROM (
           SELECT kind, json_object_agg(key, slots) AS keys FROM concurrency_key_lines
           WHERE kind LIKE 'torture.%' AND slots > 0 GROUP BY kind) k), '{}'),
       COALESCE((SELECT json_agg(json_build_object('job', e.job_id, 'kind', e.kind, 'key', e.key, 'reserved', e.reserved,
                                                   'worker', e.worker_id))
                 FROM concurrency_executions e WHERE e.kind LIKE 'torture.%'), '[]')`

// readSample reads one accounting sample, its snapshot between s.at and
// s.to. The time before it is the client's clock before the query is
// sent, not statement_timestamp(): under the extended protocol that is
// when the Execute message arrived, after the Bind message took the
// snapshot (torture seeds 870277547, 33732862 and 775596301: a sample
// stamped up to 1.5 ms after a job began, its snapshot taken before the
// commit that gave the job its slot).
func readSample(ctx context.Context, pool *pgxpool.Pool) (sample, error) {
	s := sample{at: time.Now()}
	var counted, rows, keys, keyCounts, slots []byte
	if err := pool.QueryRow(ctx, sampleSQL).Scan(&s.to, &counted, &rows, &keys, &keyCounts, &slots); err != nil {
		return s, fmt.Errorf("read the slots: %w", err)
	}
	for _, x := range []struct {
		raw []byte
		to  any
	}{{counted, &s.counted}, {rows, &s.rows}, {keys, &s.keyRows}, {keyCounts, &s.keyCounted}, {slots, &s.slots}} {
		if err := json.Unmarshal(x.raw, x.to); err != nil {
			return s, fmt.Errorf("decode the slots: %w", err)
		}
	}
	return s, nil
}

// checkAccounting: while the schedule runs, the slots the limiter counts
// (each limit row's admitted, and the slot rows and leased slots it stands
// for; per key, the key's slot rows) equal the jobs the workers' record
// shows working, within the stated propagation: never fewer than the runs
// in progress that surely hold a slot (a slot is taken before its job
// starts and freed after it ends), and never more than the runs in
// progress within slotLead before or slotLag after the sample (a grant on
// its way to its job, a release in the background, an idle leased slot).
// A worker killed holds its slots until the reaper frees them: its runs
// ended at the kill, and jobs it had fetched and not begun, count as near
// for rescueTime after it (such a job from slotLead before the kill). A
// job resumed with a grant, or granted as its parking completed, that a
// change of its kind's limits took back before it ran counts as near
// until the change's commit. The limit row's count equals its slot rows and
// leased slots in every sample (one snapshot). Every sample of a limited
// kind is judged.
func checkAccounting(r *record, vs *violations, cov coverage) {
	for _, s := range r.samples {
		for _, kind := range kinds {
			counted, hasRow := s.counted[kind]
			rows := s.rows[kind]
			if !hasRow && rows == 0 {
				continue
			}
			cov.judge("accounting")
			if hasRow && counted != rows {
				// Written in the same transactions, they agree in every
				// snapshot.
				vs.add("accounting", "%s at %s: its limit row counts %d slots, but its slot rows and leased slots are %d (limits %s)",
					kind, s.when(), counted, rows, r.limitsAt(kind, s.at))
			}
			sure, near := r.slotsAt(kind, "", s)
			for _, c := range []struct {
				what string
				n    int
				ok   bool
			}{{"its limit row counts", counted, hasRow}, {"slot rows and leased slots stand for", rows, true}} {
				switch {
				case !c.ok:
				case c.n < sure:
					vs.add("accounting", "%s at %s: %s %d slots, but %d jobs that hold one are working (limits %s; %s); the slots: %s; the jobs: %s",
						kind, s.when(), c.what, c.n, sure, r.limitsAt(kind, s.at), r.recentLimits(kind, s.at),
						r.describeSlots(s, kind, ""), r.describeSure(kind, "", s))
				case c.n > near:
					vs.add("accounting", "%s at %s: %s %d slots, but only %d jobs work within %s before and %s after (limits %s; %s); the slots: %s",
						kind, s.when(), c.what, c.n, near, slotLead, slotLag, r.limitsAt(kind, s.at),
						r.recentLimits(kind, s.at), r.describeSlots(s, kind, ""))
				}
			}
			partitions := map[string]bool{}
			for partition := range s.keyRows[kind] {
				partitions[partition] = true
			}
			for partition := range s.keyCounted[kind] {
				partitions[partition] = true
			}
			for partition := range partitions {
				var key string // the partition key is the JSON text of the args' key
				if json.Unmarshal([]byte(partition), &key) != nil {
					continue
				}
				ksure, knear := r.slotsAt(kind, key, s)
				for _, c := range []struct {
					what string
					n    int
				}{{"slot rows", s.keyRows[kind][partition]}, {"slots counted on its key row", s.keyCounted[kind][partition]}} {
					switch {
					case c.n < ksure:
						vs.add("accounting", "%s key %s at %s: %d %s, but %d jobs of the key that hold one are working; the slots: %s; the jobs: %s",
							kind, key, s.when(), c.n, c.what, ksure, r.describeSlots(s, kind, partition),
							r.describeSure(kind, key, s))
					case c.n > knear:
						vs.add("accounting", "%s key %s at %s: %d %s, but only %d jobs of the key work within %s before and %s after; the slots: %s",
							kind, key, s.when(), c.n, c.what, knear, slotLead, slotLag, r.describeSlots(s, kind, partition))
					}
				}
			}
		}
	}
}

// slotsAt is, for kind (and key, unless ""), the runs in progress from
// before sample s's snapshot to after it that surely hold a slot (every
// limit their start may have followed, and every one since, with a cap),
// and the runs in progress at some time within slotLag before it and
// slotLead after it.
func (r *record) slotsAt(kind, key string, s sample) (sure, near int) {
	t := s.at
	for _, x := range r.kindRuns(kind) {
		if key != "" && x.key != key {
			continue
		}
		end := r.runEnd(x)
		lag := slotLag
		if k := r.killedAt(x.worker); !k.IsZero() && !k.After(end) {
			lag = max(lag, rescueTime) // its slot waits for the reaper
		}
		if x.start.Before(s.until().Add(slotLead)) && end.After(t.Add(-lag)) {
			near++
		}
		if r.surelyHolds(kind, key, x, s) {
			sure++
		}
	}
	// Jobs fetched by a worker killed before they began wait for the
	// reaper, with whatever slot they were granted: near while fetched
	// within slotLag before t or slotLead after it, until rescueTime after
	// the kill.
	for _, id := range r.kindJobs(kind) {
		if key != "" && r.jobs[id].args.Key != key {
			continue
		}
		if r.fetchedByKilledNear(id, t) || r.resumedAndTakenBackNear(kind, id, t) || r.grantParkingTakenBackNear(kind, id, t) {
			near++
		}
	}
	return sure, near
}

// resumedAndTakenBackNear reports whether job id of kind was resumed (made
// available from pending) with a grant on its way to it, within slotLead
// after t, and a change of its kind's limits took that grant back in its
// own transaction (deleted the job's reserved slot or start) less than
// slotLead after the resume (a grant leads to a start within slotLead) and
// before the job ran: it went back to pending without running, and the
// change held the slot until its commit, slotLag before t at the
// earliest. The change may have begun before the resume: it waited for
// the kind's lock while the round that resumed the job held it (torture
// seed 743141786).
func (r *record) resumedAndTakenBackNear(kind string, id int64, t time.Time) bool {
	cs := r.changes[id]
	for i, c := range cs {
		if !r.isResume(id, c) || !c.at.Before(t.Add(slotLead)) {
			continue
		}
		back := time.Time{} // its return to pending, without a run
		for _, d := range cs[i+1:] {
			if d.to == "pending" {
				back = d.at
				break
			}
			if d.to != "running" {
				break
			}
		}
		if back.IsZero() || r.startedSince(id, c.at, back) {
			continue
		}
		until := back
		if lead := c.at.Add(slotLead); lead.Before(until) {
			until = lead
		}
		changes, _ := r.grantTakenBack(kind, id, c.at, until)
		for _, l := range changes {
			if l.at.After(t.Add(-slotLag)) {
				return true
			}
		}
	}
	return false
}

// surelyHolds reports whether run x of kind (key, unless "") is in
// progress from before sample s's snapshot (begun before s.at: its slot
// committed before) to after it (ended after s.to: its slot freed after)
// and surely holds a slot: every limit its start may have followed, and
// every one since, has a cap.
func (r *record) surelyHolds(kind, key string, x run, s sample) bool {
	if !x.start.Before(s.at) || !r.runEnd(x).After(s.until()) {
		return false
	}
	for _, l := range r.limitsDuring(kind, x.start, s.until()) {
		if key != "" && !(l.keyed() && l.keyCap() != unlimited) {
			return false
		}
		if key == "" && l.kindCap() == unlimited && l.keyCap() == unlimited {
			return false
		}
	}
	return true
}

// describeSure describes the runs of kind (of key, unless "") that surely
// hold a slot at sample s, with their jobs' histories, for a report.
func (r *record) describeSure(kind, key string, s sample) string {
	t := s.at
	var out []string
	for _, x := range r.kindRuns(kind) {
		if (key == "" || x.key == key) && r.surelyHolds(kind, key, x, s) {
			out = append(out, fmt.Sprintf("job %d (key %s, run on %s %s–%s, slot %q): %s; limiter's rows: %s", x.job, x.key, x.worker,
				x.start.Format("05.000000"), r.runEnd(x).Format("05.000000"), x.slot, r.history(x.job), r.lineAt(x.job, t)))
		}
	}
	return strings.Join(out, "; ")
}

// grantParkingTakenBackNear reports whether job id of kind was granted a
// slot or a start while its parking completed (LedgerGrantParked reserved
// it while the job was still running: River's completion parks it and
// resumes it at once, up to River's completion latency later), less than
// slotLead after t, and a change of its kind's limits took that grant
// back in its own transaction before the job was back in pending and
// committed less than slotLag before t: it stays parked (or is parked
// again by the worker that fetched it, when River's completion ran before
// the change committed), its slot held from the grant to the change
// without a job on its way. The same
// excuse as resumedAndTakenBackNear, for the grant that comes before the
// job is pending.
func (r *record) grantParkingTakenBackNear(kind string, id int64, t time.Time) bool {
	cs := r.changes[id]
	for i, c := range cs {
		if c.to != "running" {
			continue
		}
		// Its return to pending without a run: its parking, or, when
		// River's completion found the grant not yet taken back (the
		// change had not committed) and made it available, its parking
		// by the worker that fetched it next.
		back := time.Time{}
		for _, d := range cs[i+1:] {
			if d.to == "pending" {
				back = d.at
				break
			}
			if d.to != "running" && d.to != "available" {
				break
			}
		}
		if back.IsZero() {
			continue
		}
		g, ok := r.grantedWhileCompleting(id, c.at, back)
		if !ok || !g.Before(t.Add(slotLead)) || r.startedSince(id, c.at, back) {
			continue
		}
		changes, _ := r.grantTakenBack(kind, id, g, back)
		for _, l := range changes {
			if l.at.After(t.Add(-slotLag)) {
				return true
			}
		}
	}
	return false
}

// grantTakenBack is what deleted job id's reserved slot or start in
// [from, to]: the changes of kind's limits that did in their own
// transactions, and whether anything else did (an older job of its line
// took it, the safety net freed it).
func (r *record) grantTakenBack(kind string, id int64, from, to time.Time) (changes []limitChange, other bool) {
	for _, e := range r.line[id] {
		if !e.reserved || !strings.HasSuffix(e.what, " DELETE") || e.at.Before(from) || e.at.After(to) {
			continue
		}
		i := slices.IndexFunc(r.limits[kind], func(l limitChange) bool { return l.tx == e.tx })
		if i < 0 {
			other = true
			continue
		}
		changes = append(changes, r.limits[kind][i])
	}
	return changes, other
}

// grantedWhileCompleting is when a grant round reserved a slot or a start
// for job id in [from, to] while the job was running: granted as its
// parking completed (LedgerGrantParked), or as its step back did (a job
// resumed ahead, stepping back from its worker: LedgerInsertSlots, a slot
// reserved for a job without a worker) (ok false: none).
func (r *record) grantedWhileCompleting(id int64, from, to time.Time) (time.Time, bool) {
	for _, e := range r.line[id] {
		if !e.reserved || !strings.HasSuffix(e.what, " INSERT") ||
			!(strings.Contains(e.query, "name: LedgerGrantParked ") || strings.Contains(e.query, "name: LedgerInsertSlots ")) ||
			e.at.Before(from) || e.at.After(to) {
			continue
		}
		if c, ok := r.stateAt(id, e.at); ok && c.to == "running" {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// fetchedByKilledNear reports whether job id was fetched, and had not
// begun, at some time within slotLag before t or slotLead after it, by a
// worker killed before the job began there, less than slotLead after t (a
// job that holds a slot begins within slotLead: one held longer before
// the kill is not excused) and less than rescueTime before it.
func (r *record) fetchedByKilledNear(id int64, t time.Time) bool {
	cs := r.changes[id]
	for i, c := range cs {
		if c.to != "running" {
			continue
		}
		k := r.killedAt(c.client)
		if k.IsZero() || k.Before(c.at) || !t.Before(k.Add(rescueTime)) || !k.Before(t.Add(slotLead)) || r.startedSince(id, c.at, k) {
			continue // not killed while it held this fetch, or it began there (its run is counted)
		}
		until := k.Add(rescueTime) // fetched until the reaper's rescue
		if i+1 < len(cs) {
			if cs[i+1].at.Before(k) {
				continue // its fetch ended before the kill
			}
			until = cs[i+1].at
		}
		if c.at.Before(t.Add(slotLead)) && until.After(t.Add(-slotLag)) {
			return true
		}
	}
	return false
}

// describeSlots describes the slot rows of kind (of key partition, unless
// "") in sample s, with their jobs' histories, for a report.
func (r *record) describeSlots(s sample, kind, partition string) string {
	var out []string
	for _, e := range s.slots {
		if e.Kind != kind || (partition != "" && (e.Key == nil || *e.Key != partition)) {
			continue
		}
		w := ""
		if e.Worker != nil {
			w = *e.Worker
		}
		out = append(out, fmt.Sprintf("job %d (reserved %v, worker %q): %s; limiter's rows: %s", e.Job, e.Reserved, w,
			r.history(e.Job), r.lineAt(e.Job, s.at)))
	}
	return strings.Join(out, "; ")
}
