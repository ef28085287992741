package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/riverqueue/river/rivertype"
	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
)

// Results of an action on one job (the "result" of --json).
const (
	resultRetried         = "retried"
	resultCancelled       = "cancelled"
	resultCancelRequested = "cancel_requested"
	resultDeleted         = "deleted"
	// resultLeft: nothing to do (a finished job cancelled, a running job
	// retried).
	resultLeft = "left"
	// resultRefused: River refused (a running job deleted).
	resultRefused  = "refused"
	resultNotFound = "not_found"
)

// jobOutcome is what an action did to one job.
type jobOutcome struct {
	ID int64 `json:"id"`
	// Kind and State (after the action; left out when the job is gone or
	// was never there); WasState, of a deleted job, the state it was
	// deleted in.
	Kind     string `json:"kind,omitempty"`
	State    string `json:"state,omitempty"`
	WasState string `json:"was_state,omitempty"`
	Result   string `json:"result"`
	Message  string `json:"message"`
}

// jobAction acts on one job through River's client; an unknown id is
// rivertype.ErrNotFound.
type jobAction func(ctx context.Context, client *app.Client, id int64) (*jobOutcome, error)

func newJobsRetryCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "retry ID... [--json]",
		Short: "Make River jobs available to run again now",
		Long: `retry calls River's JobRetry on each job: a job in any state but running is
made available at once (its scheduled time is brought forward, never back),
and its max attempts is raised by one if it has none left. A running job is
left as it is. A job waiting for a concurrency slot (parked) is made
available and its parking record goes: when fetched it is admitted, or parks
again behind older jobs of its kind; it never runs twice.`,
		Args: atLeastOneID,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJobAction(cmd, g, args, asJSON, "retried", retryJob)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the outcome for each job as JSON")
	return cmd
}

func newJobsCancelCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cancel ID... [--json]",
		Short: "Cancel River jobs (a running job has its context cancelled)",
		Long: `cancel calls River's JobCancel on each job. A job that has not started
(a parked one included) is cancelled at once and never runs; a running job
is stamped with metadata.cancel_attempted_at and its context is cancelled,
and it ends when its worker returns; in the same transaction it is
registered with the cancellation monitor (task_cancellation.monitor, with
the taskcancel module), which counts it if it keeps running longer than
task_cancellation.duration_millis. A finished job is left as it is.`,
		Args: atLeastOneID,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJobAction(cmd, g, args, asJSON, "cancelled", cancelJob)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the outcome for each job as JSON")
	return cmd
}

func newJobsDeleteCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "delete ID... [--json]",
		Short: "Delete River jobs that are not running",
		Long: `delete calls River's JobDelete on each job: the row is gone, in whatever
state it was (a parked job with its parking record), except a running job,
which River refuses to delete: cancel it, then delete it once it has
stopped. A refused job makes the command exit 1 after acting on the others.`,
		Args: atLeastOneID,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJobAction(cmd, g, args, asJSON, "deleted", deleteJob)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the outcome for each job as JSON")
	return cmd
}

// runJobAction parses the ids (all of them before anything is done), acts
// on each in turn and reports each outcome. Unknown ids and refusals are
// reported together at the end, and exit 1; any other error stops at once.
func runJobAction(cmd *cobra.Command, g *globals, args []string, asJSON bool, done string, act jobAction) error {
	ids, err := parseIDs(args)
	if err != nil {
		return err
	}
	pool, client, err := g.openClient(cmd, cmd.CommandPath())
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	var (
		outcomes []*jobOutcome
		missing  []int64
		refused  []string
		stopErr  error
	)
	for _, id := range ids {
		o, err := act(ctx, client, id)
		if errors.Is(err, rivertype.ErrNotFound) {
			missing = append(missing, id)
			o, err = &jobOutcome{ID: id, Result: resultNotFound, Message: fmt.Sprintf("no job with id %d", id)}, nil
		}
		if err != nil {
			stopErr = err
			break
		}
		if o.Result == resultRefused {
			refused = append(refused, strconv.FormatInt(id, 10))
		}
		outcomes = append(outcomes, o)
		if !asJSON && o.Result != resultNotFound {
			fmt.Fprintln(out, o.Message)
		}
	}
	if asJSON && len(outcomes) > 0 {
		if err := json.NewEncoder(out).Encode(outcomes); err != nil {
			return err
		}
	}
	if stopErr != nil {
		return stopErr
	}
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, noJobs(missing).Error())
	}
	if len(refused) > 0 {
		problems = append(problems, fmt.Sprintf("not %s: %s", done, strings.Join(refused, ", ")))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// noJobs is the error of ids that match no job: a runtime failure (exit 1),
// since a job may be gone by the time its id is used (River's cleaner
// deletes finished jobs).
func noJobs(ids []int64) error {
	if len(ids) == 1 {
		return fmt.Errorf("no job with id %d", ids[0])
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return fmt.Errorf("no jobs with ids %s", strings.Join(s, ", "))
}

// retryJob retries job id with River's JobRetry.
func retryJob(ctx context.Context, client *app.Client, id int64) (*jobOutcome, error) {
	before, err := client.JobGet(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("get job %d: %w", id, err)
	}
	job, err := client.JobRetry(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("retry job %d: %w", id, err)
	}
	o := &jobOutcome{ID: job.ID, Kind: job.Kind, State: string(job.State)}
	if job.State == rivertype.JobStateRunning {
		o.Result = resultLeft
		o.Message = fmt.Sprintf("job %d (%s) is running: left as it is", job.ID, job.Kind)
		return o, nil
	}
	o.Result = resultRetried
	o.Message = fmt.Sprintf("job %d (%s) retried: %s now (was %s; attempt %d of %d)",
		job.ID, job.Kind, job.State, before.State, job.Attempt, job.MaxAttempts)
	return o, nil
}

// cancelJob cancels job id with River's JobCancel. A running job is
// tracked by the cancellation monitor (module taskcancel), when it is on,
// through the trigger on river_job that sees River's cancellation.
func cancelJob(ctx context.Context, client *app.Client, id int64) (*jobOutcome, error) {
	job, err := client.JobGet(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("get job %d: %w", id, err)
	}
	left := func(job *rivertype.JobRow) *jobOutcome {
		return &jobOutcome{ID: job.ID, Kind: job.Kind, State: string(job.State), Result: resultLeft,
			Message: fmt.Sprintf("job %d (%s) already %s: left as it is", job.ID, job.Kind, job.State)}
	}
	if job.FinalizedAt != nil {
		return left(job), nil
	}
	job, err = client.JobCancel(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("cancel job %d: %w", id, err)
	}
	o := &jobOutcome{ID: job.ID, Kind: job.Kind, State: string(job.State)}
	switch job.State {
	case rivertype.JobStateCancelled:
		o.Result = resultCancelled
		o.Message = fmt.Sprintf("job %d (%s) cancelled", job.ID, job.Kind)
	case rivertype.JobStateRunning:
		o.Result = resultCancelRequested
		o.Message = fmt.Sprintf("job %d (%s) is running: cancellation requested, its context is cancelled", job.ID, job.Kind)
	default:
		return left(job), nil
	}
	return o, nil
}

// deleteJob deletes job id with River's JobDelete, which refuses a running
// job.
func deleteJob(ctx context.Context, client *app.Client, id int64) (*jobOutcome, error) {
	job, err := client.JobDelete(ctx, id)
	if errors.Is(err, rivertype.ErrJobRunning) {
		return &jobOutcome{ID: id, State: string(rivertype.JobStateRunning), Result: resultRefused,
			Message: fmt.Sprintf("job %d is running: not deleted (River deletes no running job: cancel it, then delete it once it has stopped)", id)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("delete job %d: %w", id, err)
	}
	return &jobOutcome{ID: job.ID, Kind: job.Kind, Result: resultDeleted, WasState: string(job.State),
		Message: fmt.Sprintf("job %d (%s) deleted (was %s)", job.ID, job.Kind, job.State)}, nil
}
