package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/jobs"
)

// StatsSection is one top-level section of the stats document: a value that
// encodes as the section's JSON and prints itself as a table for people.
type StatsSection interface {
	// WriteTable prints the section under a title line.
	WriteTable(w io.Writer) error
}

// statsReader reads one section of the stats document.
type statsReader struct {
	// name is the section's key in the JSON document.
	name string
	read func(ctx context.Context, dbtx db.DBTX) (StatsSection, error)
}

// statsReaders are the sections of the stats document, in the order `sluice
// stats` prints them. A subsystem adds its summary (parked jobs, schedules,
// …) by appending one reader here: a JSON value with a WriteTable method.
var statsReaders = []statsReader{
	{name: "queues", read: readQueueStats},
	{name: "task_cancellation", read: readTaskCancellationStats},
}

// Stats is the document served at /stats and printed by `sluice stats`,
// after OpenSearch's node-stats shape: one top-level object per subsystem,
// e.g. {"queues": {…}, "task_cancellation": {"KIND":
// {"current_count_post_cancel": 0, "total_count_post_cancel": 0}}}.
type Stats struct {
	names    []string
	sections map[string]StatsSection
}

// ReadStats reads every section of the stats document through dbtx.
func ReadStats(ctx context.Context, dbtx db.DBTX) (*Stats, error) {
	s := &Stats{sections: map[string]StatsSection{}}
	for _, r := range statsReaders {
		section, err := r.read(ctx, dbtx)
		if err != nil {
			return nil, err
		}
		s.names = append(s.names, r.name)
		s.sections[r.name] = section
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
func statsHandler(dbtx db.DBTX) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), statsTimeout)
		defer cancel()
		stats, err := ReadStats(ctx, dbtx)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, stats)
	}
}

// QueueKindStats summarises one job kind of sluice_queue_overview.
type QueueKindStats struct {
	// Jobs counts the kind's jobs per River state.
	Jobs map[string]int64 `json:"jobs"`
	// OldestAvailableSeconds is how long the oldest available job of the
	// kind has waited (0 if none is available).
	OldestAvailableSeconds float64 `json:"oldest_available_seconds"`
}

// QueueStats is the "queues" section: sluice_queue_overview per kind.
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
	fmt.Fprintln(w, "Queues (sluice_queue_overview)")
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

// taskCancellationSection is the "task_cancellation" section, with the
// monitor's settings for the table's title.
type taskCancellationSection struct {
	stats    jobs.TaskCancellationStats
	settings *jobs.TaskCancellationSettings
}

func readTaskCancellationStats(ctx context.Context, dbtx db.DBTX) (StatsSection, error) {
	stats, err := jobs.ReadTaskCancellationStats(ctx, db.New(dbtx))
	if err != nil {
		return nil, err
	}
	settings, err := jobs.ReadTaskCancellationSettings(ctx, db.NewSettings(dbtx))
	if err != nil {
		return nil, err
	}
	return &taskCancellationSection{stats: stats, settings: settings}, nil
}

// MarshalJSON encodes exactly the contract's shape: {"KIND":
// {"current_count_post_cancel": N, "total_count_post_cancel": N}}.
func (s *taskCancellationSection) MarshalJSON() ([]byte, error) {
	return json.Marshal(s.stats)
}

// WriteTable prints one line per kind, under the monitor's settings.
func (s *taskCancellationSection) WriteTable(w io.Writer) error {
	kinds := "all kinds"
	if len(s.settings.Kinds) > 0 {
		kinds = "kinds " + strings.Join(s.settings.Kinds, ", ")
	}
	monitor := "enabled"
	if !s.settings.Enabled {
		monitor = "disabled"
	}
	fmt.Fprintf(w, "Task cancellation (jobs still running %s after their cancellation; monitor %s, %s)\n",
		s.settings.Duration(), monitor, kinds)
	if len(s.stats) == 0 {
		_, err := fmt.Fprintln(w, "  none")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  KIND\tCURRENT\tTOTAL")
	for _, kind := range sortedKeys(s.stats) {
		k := s.stats[kind]
		fmt.Fprintf(tw, "  %s\t%d\t%d\n", kind, k.CurrentCountPostCancel, k.TotalCountPostCancel)
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
