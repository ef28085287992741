package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
)

// silentExit ends a command with an exit code without the "sluice: …" error
// line: the command printed its own output (sluice health).
type silentExit struct{ code int }

func (e *silentExit) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func newHealthCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "health [--json]",
		Short: "Check workers, dispatchers, schedules and queues (exit 0 OK, 1 WARNING, 2 CRITICAL)",
		Long: `health checks the database, the workers' heartbeats (sluice_workers), the
schedules and the queues, and prints a report: a first line in the
monitoring-plugin format "STATUS: problems | perfdata", then one line per
check (--json: the report as JSON, the same as a worker's GET /health).

Exit codes follow the monitoring-plugin convention (Nagios, Icinga, Sensu),
which differs from sluice's other commands:
  0  OK
  1  WARNING   a dead worker is not reaped yet, some schedules are overdue (due
               longer ago than five dispatcher poll intervals, at least 5s) or
               failed (enabled, status 'failed'), some live workers'
               dispatchers have stopped ticking, a queue has available jobs
               that no live worker serves (unserved_queues), or a queue has
               been paused longer than the setting health.queue_paused_after
               (default 1h; "0s": not checked) (paused_queues)
  2  CRITICAL  the database is unreachable, no worker is live (heartbeat
               younger than three heartbeat intervals), or no live worker's
               dispatcher has ticked recently; also bad usage (no database URL)

Workers whose heartbeat stopped without a clean shutdown are reported as
stale; they do not change the status. A worker whose heartbeat is older than
its dead-after and that no live worker has reaped yet (its running jobs and
concurrency slots wait for it) is a WARNING (dead_workers).

After the checks, one line per worker (dead ones first): its status (live,
late: missed heartbeats, or dead), last heartbeat and running jobs.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := g.cliLogger(); err != nil {
				return err
			}
			if err := g.requireDatabaseURL(); err != nil {
				return err
			}
			report, err := app.CheckHealth(cmd.Context(), g.databaseURL, g.prog.Schemas)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(report); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(out, report.Summary())
				for _, c := range report.Checks {
					fmt.Fprintf(out, "%-18s %-8s %s\n", c.Name, c.Status, c.Message)
				}
				for _, w := range report.Workers {
					fmt.Fprintf(out, "worker %s %s: heartbeat %.1fs ago (dead after %gs), %d running jobs, host %s pid %d\n",
						w.ID, w.Status, w.HeartbeatAgeSeconds, w.DeadAfterSeconds, w.RunningJobs, w.Host, w.Pid)
				}
			}
			if code := report.ExitCode(); code != 0 {
				return &silentExit{code: code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
