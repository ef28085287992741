package jobtest

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scraper gathers the metrics a Prometheus text page at URL serves (a
// worker's /metrics), so that MetricValue reads a live process's metrics
// as it reads a registry's.
type Scraper struct{ URL string }

// Gather fetches and parses the page.
func (s Scraper) Gather() ([]*dto.MetricFamily, error) {
	resp, err := http.Get(s.URL)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", s.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", s.URL, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", s.URL, err)
	}
	families := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		families = append(families, f)
	}
	return families, nil
}

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
