package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
)

// StatsSection is one top-level section of the stats document.
type StatsSection = module.StatsSection

// statsReaders are the sections of the stats document, in the order `sluice
// stats` prints them: the core's, then the modules' (module.Module.Stats).
// A section is a JSON value with a WriteTable method.
func statsReaders(modules []module.Module) []module.StatsReader {
	readers := []module.StatsReader{{Name: "queues", Read: readQueueStats}}
	for _, m := range modules {
		readers = append(readers, m.Stats...)
	}
	return readers
}

// Stats is the document served at /stats and printed by `sluice stats`,
// after OpenSearch's node-stats shape: one top-level object per subsystem,
// e.g. {"queues": {…}, "task_cancellation": {"KIND":
// {"current_count_post_cancel": 0, "total_count_post_cancel": 0}}}.
type Stats struct {
	names    []string
	sections map[string]StatsSection
}

// ReadStats reads every section of the stats document through dbtx: the
// core's and those of modules.
func ReadStats(ctx context.Context, dbtx db.DBTX, modules []module.Module) (*Stats, error) {
	s := &Stats{sections: map[string]StatsSection{}}
	for _, r := range statsReaders(modules) {
		section, err := r.Read(ctx, dbtx)
		if err != nil {
			return nil, err
		}
		s.names = append(s.names, r.Name)
		s.sections[r.Name] = section
	}
	return s, nil
}

// Section returns the section called name, or nil.
func (s *Stats) Section(name string) StatsSection { return s.sections[name] }

// MarshalJSON encodes the sections as one object, in section order.
func (s *Stats) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, name := range s.names {
		if i > 0 {
			buf.WriteByte(',')
		}
		key, _ := json.Marshal(name)
		value, err := json.Marshal(s.sections[name])
		if err != nil {
			return nil, fmt.Errorf("encode stats section %s: %w", name, err)
		}
		buf.Write(key)
		buf.WriteByte(':')
		buf.Write(value)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// WriteTable prints every section as a table, separated by blank lines.
func (s *Stats) WriteTable(w io.Writer) error {
	for i, name := range s.names {
		if i > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		if err := s.sections[name].WriteTable(w); err != nil {
			return err
		}
	}
	return nil
}

// statsTimeout bounds the database reads of one /stats request.
const statsTimeout = 10 * time.Second

// statsHandler serves the stats document as JSON; 503 if the database
// cannot be read.
func statsHandler(dbtx db.DBTX, modules []module.Module) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), statsTimeout)
		defer cancel()
		stats, err := ReadStats(ctx, dbtx, modules)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, stats)
	}
}

// QueueKindStats summarises one job kind of sluice.queue_overview.
type QueueKindStats struct {
	// Jobs counts the kind's jobs per River state.
	Jobs map[string]int64 `json:"jobs"`
	// OldestAvailableSeconds is how long the oldest available job of the
	// kind has waited (0 if none is available).
	OldestAvailableSeconds float64 `json:"oldest_available_seconds"`
}

// QueueStats is the "queues" section (its JSON key, kept for /stats
// readers): sluice.queue_overview, jobs per kind and state.
type QueueStats map[string]*QueueKindStats

func readQueueStats(ctx context.Context, dbtx db.DBTX) (StatsSection, error) {
	rows, err := db.New(dbtx).QueueOverview(ctx)
	if err != nil {
		return nil, fmt.Errorf("read queue overview: %w", err)
	}
	out := QueueStats{}
	for _, r := range rows {
		k := out[r.Kind]
		if k == nil {
			k = &QueueKindStats{Jobs: map[string]int64{}}
			out[r.Kind] = k
		}
		k.Jobs[r.State] = r.Jobs
		if r.OldestAvailableSeconds > k.OldestAvailableSeconds {
			k.OldestAvailableSeconds = r.OldestAvailableSeconds
		}
	}
	return out, nil
}

// WriteTable prints one line per kind and state.
func (q QueueStats) WriteTable(w io.Writer) error {
	fmt.Fprintln(w, "Jobs per kind and state (sluice.queue_overview)")
	if len(q) == 0 {
		_, err := fmt.Fprintln(w, "  no jobs")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  KIND\tSTATE\tJOBS\tOLDEST AVAILABLE")
	for _, kind := range sortedKeys(q) {
		k := q[kind]
		for _, state := range sortedKeys(k.Jobs) {
			oldest := ""
			if state == "available" {
				oldest = (time.Duration(k.OldestAvailableSeconds * float64(time.Second))).Round(time.Millisecond).String()
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", kind, state, k.Jobs[state], oldest)
		}
	}
	return tw.Flush()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
