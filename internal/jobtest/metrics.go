package jobtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricValue is the value of the counter or gauge (a histogram: its count
// of observations) name with exactly labels in what g gathers (0 when there
// is no such series).
func MetricValue(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	families, err := g.Gather()
	if err != nil {
		tb.Fatalf("jobtest: gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
