package torture

import (
	"time"
)

// checkOutcomes: nothing lost, nothing twice. Every job the test inserted
// ends as River documents and as the test's own operations explain: one
// gone from river_job was deleted by the test's JobDelete; a cancelled one
// was cancelled by the test; a discarded one failed max_attempts times
// (and its args make it fail that often); a completed one ran to success
// exactly once, last; a job cancelled or deleted while it waited never
// started after; and its attempt counts its real executions (a snooze
// gives its attempt back). Every job is judged.
func checkOutcomes(r *record, vs *violations, cov coverage) {
	for id, j := range r.jobs {
		cov.judge("outcome")
		runs := r.runsOf[id]
		ok, snoozes, failed := 0, 0, 0
		for _, x := range runs {
			switch x.outcome {
			case "ok":
				ok++
			case "snooze":
				snoozes++
			default:
				failed++
			}
			if x.end.IsZero() {
				vs.add("outcome", "job %d: a run started at %s on %s never ended", id, x.start.Format(time.StampMicro), x.worker)
			}
		}
		deleted, cancelled := false, false
		for _, op := range r.ops {
			if op.job != id {
				continue
			}
			deleted = deleted || op.op == "delete"
			cancelled = cancelled || op.op == "cancel"
			if (op.op == "cancel" && op.state != "cancelled") || (op.op != "cancel" && op.op != "delete") {
				continue
			}
			if op.op == "delete" && j.final != "" {
				// Not deleted: River's JobDelete racing a fetch of the job
				// waits for the fetch's row lock, deletes nothing (the job
				// is running), and returns the row as its snapshot had it,
				// not running, with no error; the job ran and ended.
				continue
			}
			tolerance := time.Duration(0)
			if op.op == "cancel" && op.state == "running" {
				tolerance = cancelTolerance
			}
			for _, x := range runs {
				if x.start.After(op.after.Add(tolerance)) {
					vs.add("outcome", "job %d ran at %s after the test's %s at %s (state then %s); %s", id, x.start.Format(time.StampMicro), op.op,
						op.after.Format(time.StampMicro), op.state, r.history(id))
				}
			}
		}
		switch j.final {
		case "":
			if !deleted {
				vs.add("outcome", "job %d is gone from river_job, and the test never deleted it (lost); %s", id, r.history(id))
			}
			continue
		case "completed":
			if len(runs) == 0 {
				vs.add("outcome", "job %d completed without a run", id)
				continue
			}
			// Every successful run but the last must have lost its
			// completion to a kill.
			lost := r.lostToKills(runs[:len(runs)-1])
			if ok-lost != 1 || runs[len(runs)-1].outcome != "ok" {
				vs.add("outcome", "job %d completed with %d successful runs of %d (%d of them on a worker killed right after)",
					id, ok, len(runs), lost)
			}
		case "discarded":
			// A kill may have had River count an attempt that never ran
			// (over), or undo one that did (under, the attempt check below).
			over, under := r.killBlur(id)
			// A successful run may have lost its completion to a kill (River
			// counts its attempt, as the rescue's), and the job failed after
			// (an enqueue policy's replace gave it args that fail).
			lost := r.lostToKills(runs)
			if ok-lost != 0 || failed > j.maxAttempts+under || failed+over+lost < j.maxAttempts {
				vs.add("outcome", "job %d discarded after %d failed runs (max attempts %d) and %d successful; %s", id, failed,
					j.maxAttempts, ok, r.history(id))
			}
			if j.args.Fail < j.maxAttempts {
				vs.add("outcome", "job %d discarded, though only its first %d attempts fail (max attempts %d); %s", id,
					j.args.Fail, j.maxAttempts, r.history(id))
			}
		case "cancelled":
			if !cancelled {
				vs.add("outcome", "job %d cancelled, and the test never cancelled it; %s", id, r.history(id))
			}
		default:
			vs.add("outcome", "job %d is still %s at the end", id, j.final)
			continue
		}
		if last := len(runs) - 1; last >= 0 && j.final == "cancelled" && runs[last].outcome == "snooze" &&
			r.cancelledRunning(id) && !r.fetchedAfter(id, runs[last].end) {
			// River cancels a job whose cancellation was asked while it
			// snoozed, at the snooze's completion, and keeps its attempt.
			// (A job fetched again after its snooze and cancelled while it
			// waited for a slot has that attempt undone by its parking.)
			snoozes--
		}
		over, under := r.killBlur(id)
		if d := j.attempt - (len(runs) - snoozes); d > over || -d > under {
			vs.add("outcome", "job %d: attempt %d, but %d real executions (%d snoozed; errors %q); %s", id, j.attempt,
				len(runs)-snoozes, snoozes, j.errors, r.history(id))
		}
	}
}

// cancelledRunning reports whether job id went from running straight to
// cancelled (its completion found its cancellation asked).
func (r *record) cancelledRunning(id int64) bool {
	for _, c := range r.changes[id] {
		if c.to == "cancelled" {
			return c.from == "running"
		}
	}
	return false
}

// fetchedAfter reports whether job id was fetched (made running) after t.
func (r *record) fetchedAfter(id int64, t time.Time) bool {
	for _, c := range r.changes[id] {
		if c.to == "running" && c.at.After(t) {
			return true
		}
	}
	return false
}

// killBlur is how far a kill may have made job id's attempt count differ
// from its real executions, as River counts them. over: the kills of
// workers that had fetched the job and not started it (River counts an
// attempt for a job its worker fetched and never ran; under sluice the
// job may also be between its fetch and its limiter's decision, or
// waiting for a leased slot, which its worker publishes within 20 ms).
// A snooze whose completion the kill lost counts as an attempt too. under:
// the kills of workers that had started running it within killTolerance
// (still listed as waiting for a leased slot, it is parked by the rescue,
// its attempt undone).
func (r *record) killBlur(id int64) (over, under int) {
	for _, e := range r.workers {
		if e.what != "kill" {
			continue
		}
		// A fetch the worker sent before it died may still commit just
		// after: Postgres finishes the statement.
		var fetched time.Time
		for _, c := range r.changes[id] {
			if c.to == "running" && c.client == e.worker && !c.at.After(e.at.Add(killTolerance)) {
				fetched = c.at
			}
		}
		if fetched.IsZero() {
			continue
		}
		ran := false
		for _, x := range r.runsOf[id] {
			if x.worker == e.worker && !x.start.Before(fetched) && !x.start.After(e.at.Add(killTolerance)) {
				ran = true
				waited := x.start.Sub(fetched) > waitedFor
				if e.at.Sub(x.start) < killTolerance || (waited && e.at.Sub(x.start) < handOverWriteWindow) {
					under++
				}
				if x.outcome == "snooze" && !x.end.IsZero() && e.at.Sub(x.end) < completionWindow {
					over++ // the snooze's completion may be lost: River counts the attempt
				}
			}
		}
		if !ran {
			over++
		}
	}
	return over, under
}

// lostToKills counts the successful runs of runs whose worker was killed
// within completionWindow of their end: River may not have written their
// completion, and works the job again (at least once).
func (r *record) lostToKills(runs []run) int {
	lost := 0
	for _, x := range runs {
		if killed := r.killedAt(x.worker); x.outcome == "ok" && !killed.IsZero() && !x.end.IsZero() &&
			killed.Sub(x.end) < completionWindow {
			lost++
		}
	}
	return lost
}
