package taskcancel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/taskcancel"
)

// gauges reads the module's cluster-wide gauges: metric name and kind to
// value.
func gauges(t *testing.T, q *db.Queries) (map[string]float64, error) {
	t.Helper()
	ms, err := taskcancel.ClusterSource(context.Background(), q)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range ms {
		var pb dto.Metric
		require.NoError(t, m.Write(&pb))
		name := m.Desc().String()
		name = name[strings.Index(name, `"`)+1:]
		name = name[:strings.Index(name, `"`)]
		key := name + "{" + pb.GetLabel()[0].GetValue() + "}"
		switch {
		case pb.GetGauge() != nil:
			out[key] = pb.GetGauge().GetValue()
		case pb.GetCounter() != nil:
			out[key] = pb.GetCounter().GetValue()
		}
	}
	return out, nil
}

// TestTaskCancellationGauges: the module's cluster-wide gauges are the
// database's numbers when read; a read that fails is an error (the
// exporter keeps its last figures).
func TestTaskCancellationGauges(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)
	got, err := gauges(t, db.New(pool))
	require.NoError(t, err)
	require.Empty(t, got)

	ids := env.startHeld(t, 3)
	env.cancel(t, ids[:2]...)
	env.monitor(t)
	env.complete(t, ids[0])
	got, err = gauges(t, db.New(pool))
	require.NoError(t, err)
	require.Equal(t, map[string]float64{
		"sluice_task_cancellation_count_post_cancel_total{test.hold}": 2,
		"sluice_cancelled_still_running{test.hold}":                   1,
	}, got)

	closed, err := pgkit.Open(context.Background(), testdb.New(t), 10*time.Second)
	require.NoError(t, err)
	closed.Close()
	_, err = gauges(t, db.New(closed))
	require.Error(t, err)
}
