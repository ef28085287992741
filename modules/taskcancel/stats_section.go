package taskcancel

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/settings"
)

// taskCancellationSection is the "task_cancellation" section, with the
// monitor's settings for the table's title.
type taskCancellationSection struct {
	stats    TaskCancellationStats
	settings *TaskCancellationSettings
}

func readStatsSection(ctx context.Context, dbtx db.DBTX) (module.StatsSection, error) {
	stats, err := ReadTaskCancellationStats(ctx, db.New(dbtx))
	if err != nil {
		return nil, err
	}
	settings, err := ReadTaskCancellationSettings(ctx, settings.New(dbtx))
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
	which := "all kinds"
	if len(s.settings.Kinds) > 0 {
		which = "kinds " + strings.Join(s.settings.Kinds, ", ")
	}
	monitor := "enabled"
	if !s.settings.Enabled {
		monitor = "disabled"
	}
	fmt.Fprintf(w, "Task cancellation (jobs still running %s after their cancellation; monitor %s, %s)\n",
		s.settings.Duration(), monitor, which)
	if len(s.stats) == 0 {
		_, err := fmt.Fprintln(w, "  none")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  KIND\tCURRENT\tTOTAL")
	kinds := make([]string, 0, len(s.stats))
	for kind := range s.stats {
		kinds = append(kinds, kind)
	}
	sort.Strings(kinds)
	for _, kind := range kinds {
		k := s.stats[kind]
		fmt.Fprintf(tw, "  %s\t%d\t%d\n", kind, k.CurrentCountPostCancel, k.TotalCountPostCancel)
	}
	return tw.Flush()
}
