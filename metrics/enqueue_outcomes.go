package metrics

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
)

// enqueueOutcomesDesc is the enqueue policies' family (public name).
var enqueueOutcomesDesc = prometheus.NewDesc("sluice_enqueue_outcomes_total",
	"Inserts of kinds with an enqueue policy, per outcome (inserted, discarded, replaced, debounced), committed, whole cluster "+
		"(from enqueue_policy_counts; rejected inserts are not counted: their error rolls the count back; `policy clear` resets a kind).",
	[]string{"kind", "outcome"}, nil)

// enqueueOutcomesSource reads the outcome counts of the enqueue policies.
func enqueueOutcomesSource(ctx context.Context, q *db.Queries) ([]prometheus.Metric, error) {
	rows, err := q.EnqueuePolicyOutcomes(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue outcomes: %w", err)
	}
	out := make([]prometheus.Metric, 0, len(rows))
	for _, r := range rows {
		out = append(out, prometheus.MustNewConstMetric(enqueueOutcomesDesc, prometheus.CounterValue, float64(r.Count), r.Kind, r.Outcome))
	}
	return out, nil
}
