package cli

import (
	"strconv"

	"github.com/spf13/cobra"
)

func newJobsCmd(g *globals) *cobra.Command {
	cmd := groupCmd("jobs", "List, show, retry, cancel and delete River jobs")
	cmd.Long = `jobs works on River jobs through River's client (JobList, JobGet, JobRetry,
JobCancel, JobDelete), so River's rules hold, for every kind in the
database: sluice's, the modules' and the application's own.

A job waiting for a concurrency slot (parked) is the same River job, in
River's pending state: show tells why and since when it waits, and retry,
cancel and delete act on it as on any waiting job (its parking record goes
with it).

retry, cancel and delete take several IDs: each is acted on and reported in
turn. An ID that is not a positive integer is bad input (exit 2, nothing
done); an ID with no job is reported and the command exits 1 after acting
on the others.`
	cmd.AddCommand(
		newJobsListCmd(g),
		newJobsShowCmd(g),
		newJobsRetryCmd(g),
		newJobsCancelCmd(g),
		newJobsDeleteCmd(g),
	)
	return cmd
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

// parseIDs parses positive job ids, each once, in the order given.
func parseIDs(args []string) ([]int64, error) {
	seen := map[int64]bool{}
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := parseID(a)
		if err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// atLeastOneID is the positional args check of the commands that take job
// IDs.
func atLeastOneID(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return usagef("%s expects one or more job IDs", cmd.CommandPath())
	}
	return nil
}
