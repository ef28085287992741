package app

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/settings"
)

// QueuePausedAfterSetting is the dynamic setting (a duration string) past
// which a paused queue is a health WARNING; "0s" turns the check off.
const QueuePausedAfterSetting = "health.queue_paused_after"

// DefaultQueuePausedAfter is the value of QueuePausedAfterSetting when its
// row is missing: a pause for maintenance or an incident lasts minutes; one
// still on after an hour was most likely forgotten.
const DefaultQueuePausedAfter = time.Hour

// QueueReportedWithin is how recently a River client must have reported a
// queue (river_queue.updated_at; River's producers report every 10 minutes
// by default) for it to count as served though no sluice worker recorded it
// (a queue added to a running client, a plain River client).
const QueueReportedWithin = 15 * time.Minute

// runQueueLike matches the private queues of `sluice run` in SQL LIKE.
var runQueueLike = strings.ReplaceAll(RunQueuePrefix, "_", `\_`) + "%"

// checkQueues adds the queue checks to r:
//   - unserved_queues: WARNING when a queue has available jobs that no live
//     worker serves (the queues a worker serves are in its sluice_workers
//     row; a queue a River client reported within QueueReportedWithin
//     counts as served too);
//   - paused_queues: WARNING when a queue has been paused longer than the
//     setting health.queue_paused_after (default 1h; "0s": never).
func (r *HealthReport) checkQueues(ctx context.Context, dbtx db.DBTX) {
	q := db.New(dbtx)
	r.UnservedQueueNames, r.PausedQueueNames = []string{}, []string{}
	unserved, err := q.UnservedQueues(ctx, db.UnservedQueuesParams{
		SkipLike: runQueueLike, ReportedWithinSeconds: QueueReportedWithin.Seconds(),
	})
	switch {
	case err != nil:
		r.add("unserved_queues", HealthWarning, "query failed: %s", oneLineErr(err))
	case len(unserved) > 0:
		r.UnservedQueues = int64(len(unserved))
		var names []string
		for _, u := range unserved {
			if len(names) < healthNamesShown {
				r.UnservedQueueNames = append(r.UnservedQueueNames, u.Queue)
				names = append(names, fmt.Sprintf("%s (%d available, oldest waiting %s)", u.Queue, u.Available, shortDuration(roundSeconds(u.OldestAvailableSeconds))))
			}
		}
		r.add("unserved_queues", HealthWarning, "%d with available jobs that no live worker serves (start a worker with --queues): %s",
			len(unserved), listNames(names, int64(len(unserved))))
	default:
		r.add("unserved_queues", HealthOK, "none")
	}

	after, err := settings.New(dbtx).Duration(ctx, QueuePausedAfterSetting, DefaultQueuePausedAfter)
	if err != nil {
		r.add("paused_queues", HealthWarning, "%s", oneLineErr(err))
		return
	}
	r.PausedAfterSeconds = after.Seconds()
	if after == 0 {
		r.add("paused_queues", HealthOK, "not checked (%s is 0)", QueuePausedAfterSetting)
		return
	}
	paused, err := q.PausedQueues(ctx, after.Seconds())
	switch {
	case err != nil:
		r.add("paused_queues", HealthWarning, "query failed: %s", oneLineErr(err))
	case len(paused) > 0:
		r.PausedQueues = int64(len(paused))
		var names []string
		for _, p := range paused {
			if len(names) < healthNamesShown {
				r.PausedQueueNames = append(r.PausedQueueNames, p.Queue)
				names = append(names, fmt.Sprintf("%s (paused %s ago, %d available)", p.Queue, shortDuration(roundSeconds(p.PausedSeconds)), p.Available))
			}
		}
		r.add("paused_queues", HealthWarning, "%d paused longer than %s (`sluice queues resume QUEUE`): %s",
			len(paused), shortDuration(after), listNames(names, int64(len(paused))))
	default:
		r.add("paused_queues", HealthOK, "none paused longer than %s", shortDuration(after))
	}
}

// roundSeconds formats a number of seconds as a duration, to the second.
func roundSeconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Second)
}

// shortDuration writes d without its zero minutes and seconds: 1h, not
// 1h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
