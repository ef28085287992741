package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
)

// allQueues is River's name for every queue in QueuePause and QueueResume.
const allQueues = "*"

func newQueuesCmd(g *globals) *cobra.Command {
	cmd := groupCmd("queues", "List, pause and resume River queues")
	cmd.Long = `A queue is River's: jobs are inserted into one (the kind's own, or
enqueue --queue) and a worker works the queues it serves (worker --queues
default=20,emails=5; the maintenance queue always). River knows a queue once
a client has served it, and forgets it 24 hours after the last one stopped.

pause and resume use River's QueuePause and QueueResume: the workers serving
a paused queue fetch none of its jobs (running ones finish) until it is
resumed; a worker started later starts paused. "*" is every queue River
knows. 'sluice health' warns about a queue paused longer than the setting
health.queue_paused_after (default 1h), and about available jobs in a queue
no live worker serves.`
	cmd.AddCommand(newQueuesListCmd(g), newQueuePauseCmd(g, true), newQueuePauseCmd(g, false))
	return cmd
}

// queueView is a queue as `sluice queues list --json` prints it.
type queueView struct {
	Queue                  string       `json:"queue"`
	Available              int64        `json:"available"`
	Pending                int64        `json:"pending"`
	Running                int64        `json:"running"`
	Retryable              int64        `json:"retryable"`
	Scheduled              int64        `json:"scheduled"`
	OldestAvailableSeconds float64      `json:"oldest_available_seconds"`
	PausedAt               *time.Time   `json:"paused_at"`
	ServedBy               []servedView `json:"served_by"`
}

// servedView is a live worker serving a queue, with how many of its jobs it
// works at once (0: not recorded, a worker of an older sluice).
type servedView struct {
	Worker     string `json:"worker"`
	MaxWorkers int    `json:"max_workers"`
}

func newQueuesListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List queues: jobs per state, oldest available, paused, served by",
		Long: `list prints every queue River knows, holds a job not yet finished, or a live
worker serves: its jobs available, pending (parked ones included), running,
retryable and scheduled (finished jobs are not counted: River keeps them a
day, discarded ones a week; River UI lists them), how long its oldest
available job has waited, since when it
is paused, and the live workers that serve it with how many of its jobs each
works at once (from their sluice_workers rows).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.openPool(cmd, "sluice queues list")
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := db.New(pool).QueueList(cmd.Context())
			if err != nil {
				return fmt.Errorf("list queues: %w", err)
			}
			views := make([]*queueView, 0, len(rows))
			for _, r := range rows {
				v := &queueView{Queue: r.Queue, Available: r.Available, Pending: r.Pending, Running: r.Running,
					Retryable: r.Retryable, Scheduled: r.Scheduled, OldestAvailableSeconds: r.OldestAvailableSeconds,
					PausedAt: r.PausedAt, ServedBy: []servedView{}}
				var served map[string]int
				if err := json.Unmarshal(r.ServedBy, &served); err != nil {
					return fmt.Errorf("decode the workers of queue %s: %w", r.Queue, err)
				}
				for _, w := range slices.Sorted(maps.Keys(served)) {
					v.ServedBy = append(v.ServedBy, servedView{Worker: w, MaxWorkers: served[w]})
				}
				views = append(views, v)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(views)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "QUEUE\tAVAILABLE\tPENDING\tRUNNING\tRETRYABLE\tSCHEDULED\tOLDEST AVAILABLE\tPAUSED\tSERVED BY")
			for _, v := range views {
				oldest := "-"
				if v.Available > 0 {
					oldest = roundSecs(v.OldestAvailableSeconds).String()
				}
				paused := "no"
				if v.PausedAt != nil {
					paused = "since " + v.PausedAt.UTC().Format(time.RFC3339)
				}
				served := "none"
				if len(v.ServedBy) > 0 {
					var ws []string
					for _, s := range v.ServedBy {
						ws = append(ws, fmt.Sprintf("%s (%d)", s.Worker, s.MaxWorkers))
					}
					served = strings.Join(ws, ", ")
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", v.Queue, v.Available, v.Pending, v.Running,
					v.Retryable, v.Scheduled, oldest, paused, served)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// newQueuePauseCmd is `queues pause Q` (pause) or `queues resume Q`.
func newQueuePauseCmd(g *globals, pause bool) *cobra.Command {
	verb, done := "resume", "resumed"
	short := "Resume a paused River queue (River's QueueResume)"
	act := func(ctx context.Context, client *app.Client, name string) error {
		return client.QueueResume(ctx, name, nil)
	}
	if pause {
		verb, done = "pause", "paused"
		short = "Pause a River queue: its jobs wait until resumed (River's QueuePause)"
		act = func(ctx context.Context, client *app.Client, name string) error {
			return client.QueuePause(ctx, name, nil)
		}
	}
	return &cobra.Command{
		Use:   verb + " QUEUE",
		Short: short,
		Args:  exactArgs(1, `a QUEUE (or "*" for every queue)`),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if name != allQueues {
				if err := app.ValidateQueueName(name); err != nil {
					return asUsage(err)
				}
			}
			pool, client, err := g.openClient(cmd, cmd.CommandPath())
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			if name == allQueues {
				if err := act(ctx, client, name); err != nil {
					return fmt.Errorf("%s every queue: %w", verb, err)
				}
				fmt.Fprintf(out, "every queue %s\n", done)
				return nil
			}
			q, err := client.QueueGet(ctx, name)
			if errors.Is(err, rivertype.ErrNotFound) {
				return unknownQueue(cmd.Root().Name(), name)
			}
			if err != nil {
				return fmt.Errorf("get queue %s: %w", name, err)
			}
			switch {
			case pause && q.PausedAt != nil:
				fmt.Fprintf(out, "queue %s already paused (since %s)\n", name, q.PausedAt.UTC().Format(time.RFC3339))
				return nil
			case !pause && q.PausedAt == nil:
				fmt.Fprintf(out, "queue %s is not paused\n", name)
				return nil
			}
			err = act(ctx, client, name)
			if errors.Is(err, rivertype.ErrNotFound) {
				return unknownQueue(cmd.Root().Name(), name)
			}
			if err != nil {
				return fmt.Errorf("%s queue %s: %w", verb, name, err)
			}
			if pause {
				fmt.Fprintf(out, "queue %s paused: its jobs wait until '%s queues resume %s'\n", name, cmd.Root().Name(), name)
			} else {
				fmt.Fprintf(out, "queue %s resumed\n", name)
			}
			return nil
		},
	}
}

// unknownQueue is the error of a queue River does not know: a runtime
// failure (exit 1), as River forgets the queues no client served for a day.
func unknownQueue(program, name string) error {
	return fmt.Errorf("no queue %q known to River (River knows a queue once a worker has served it, for 24 hours after the last one stopped; see %s queues list)", name, program)
}

// roundSecs formats seconds as a duration to the second.
func roundSecs(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Second)
}
