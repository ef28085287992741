package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/riverqueue/river/rivertype"
	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
)

func newJobsCmd(g *globals) *cobra.Command {
	cmd := groupCmd("jobs", "Act on River jobs")
	cmd.AddCommand(&cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a River job (a running job has its context cancelled)",
		Long: `cancel calls River's JobCancel. A job that has not started is cancelled at
once; a running job is stamped with metadata.cancel_attempted_at and its
context is cancelled, and it ends when its worker returns; in the same
transaction it is registered with the cancellation monitor
(task_cancellation.monitor), which counts it if it keeps running longer than
task_cancellation.duration_millis. A finished job is left as it is. An
unknown ID is an input error (exit 2).`,
		Args: exactArgs(1, "a job ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			pool, client, err := g.openClient(cmd, "sluice jobs cancel")
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			job, err := client.JobGet(ctx, id)
			if errors.Is(err, rivertype.ErrNotFound) {
				return usagef("no job with id %d", id)
			}
			if err != nil {
				return fmt.Errorf("look up job %d: %w", id, err)
			}
			if job.FinalizedAt != nil {
				fmt.Fprintf(out, "job %d (%s) already %s: left as it is\n", job.ID, job.Kind, job.State)
				return nil
			}
			job, err = cancelJob(ctx, client, id)
			if errors.Is(err, rivertype.ErrNotFound) {
				return usagef("no job with id %d", id)
			}
			if err != nil {
				return err
			}
			switch job.State {
			case rivertype.JobStateCancelled:
				fmt.Fprintf(out, "job %d (%s) cancelled\n", job.ID, job.Kind)
			case rivertype.JobStateRunning:
				fmt.Fprintf(out, "job %d (%s) is running: cancellation requested, its context is cancelled\n", job.ID, job.Kind)
			default:
				fmt.Fprintf(out, "job %d (%s) already %s: left as it is\n", job.ID, job.Kind, job.State)
			}
			return nil
		},
	})
	return cmd
}

// cancelJob cancels job id with River's JobCancel. A running job is
// tracked by the cancellation monitor (module taskcancel), when it is on,
// through the trigger on river_job that sees River's cancellation.
func cancelJob(ctx context.Context, client *app.Client, id int64) (*rivertype.JobRow, error) {
	job, err := client.JobCancel(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("cancel job %d: %w", id, err)
	}
	return job, nil
}

// groupCmd is a command that only holds subcommands; run without one (or
// with an unknown one) it is a usage error.
func groupCmd(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs a subcommand", cmd.CommandPath())
			}
			return usagef("unknown subcommand %q for %s", args[0], cmd.CommandPath())
		},
	}
}

// parseID parses a positive job id.
func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("invalid job ID %q: want a positive integer", s)
	}
	return id, nil
}
