package cli

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/spf13/cobra"
)

func newEnqueueCmd(g *globals) *cobra.Command {
	var argsJSON, queue, at string
	registry := g.registry
	cmd := &cobra.Command{
		Use:   "enqueue KIND [--args JSON] [--queue Q] [--at RFC3339]",
		Short: "Insert a River job of KIND and print its id",
		Long: `enqueue inserts one River job for the workers to pick up and prints its id.
The args are checked against KIND before anything is written.

Kinds: ` + strings.Join(registry.Names(), ", "),
		Args: exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			jobArgs, err := registry.Decode(args[0], []byte(argsJSON))
			if err != nil {
				return err
			}
			opts := &river.InsertOpts{Queue: queue}
			if queue != "" && !validQueueName(queue) {
				return usagef("invalid --queue %q: want lowercase letters and digits separated by _ or -, at most 64 characters", queue)
			}
			if at != "" {
				t, err := time.Parse(time.RFC3339, at)
				if err != nil {
					return usagef("invalid --at %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", at)
				}
				opts.ScheduledAt = t
			}
			pool, client, err := g.openClient(cmd, "sluice enqueue")
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			res, err := client.Insert(ctx, jobArgs, opts)
			if err != nil {
				return fmt.Errorf("insert %s job: %w", args[0], err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.Job.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&argsJSON, "args", "{}", "job args as a JSON object")
	cmd.Flags().StringVar(&queue, "queue", "", "queue to insert into (default: the kind's queue)")
	cmd.Flags().StringVar(&at, "at", "", "run no earlier than this RFC 3339 time")
	return cmd
}

// queueNameRE is River's rule for queue names (river.validateQueueName).
var queueNameRE = regexp.MustCompile(`^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$`)

// validQueueName reports whether River accepts name as a queue name.
func validQueueName(name string) bool {
	return len(name) <= 64 && queueNameRE.MatchString(name)
}
