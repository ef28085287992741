package metrics_test

import (
	"context"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/metrics"
)

// sluice_enqueue_outcomes_total counts the outcomes the enqueue policy
// trigger recorded, per kind and outcome.
func TestEnqueueOutcomesSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	for _, sql := range []string{
		`INSERT INTO enqueue_policies (kind, by_args, max_waiting, on_conflict) VALUES ('demo.sleep', '{ms}', 1, 'discard')`,
		`INSERT INTO river_job (kind, args, max_attempts) VALUES ('demo.sleep', '{"ms": 1}', 5)`,
		`INSERT INTO river_job (kind, args, max_attempts) VALUES ('demo.sleep', '{"ms": 1}', 5)`,
		`INSERT INTO river_job (kind, args, max_attempts) VALUES ('demo.sleep', '{"ms": 1}', 5)`,
		`INSERT INTO river_job (kind, args, max_attempts) VALUES ('demo.sleep', '{"ms": 2}', 5)`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	got := map[string]float64{}
	for _, source := range metrics.CoreSources() {
		ms, err := source(ctx, db.New(pool))
		require.NoError(t, err)
		for _, m := range ms {
			if !strings.Contains(m.Desc().String(), `"sluice_enqueue_outcomes_total"`) {
				continue
			}
			var out dto.Metric
			require.NoError(t, m.Write(&out))
			labels := map[string]string{}
			for _, l := range out.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Equal(t, "demo.sleep", labels["kind"])
			got[labels["outcome"]] = out.GetCounter().GetValue()
		}
	}
	require.Equal(t, map[string]float64{"inserted": 2, "discarded": 2, "replaced": 0, "debounced": 0}, got)
}
