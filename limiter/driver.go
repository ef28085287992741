package limiter

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// maxFetchThrough is how many times one of River's fetches fetches again
// for the jobs that parked at it: a backlog of one key, available, is
// worked through (parked, most of it) in few of River's fetch cycles, and
// a job of another key inserted behind it is fetched soon.
const maxFetchThrough = 16

// Driver returns River's pgx driver d with the limiter deciding the jobs
// of kinds (the kinds the client works) that each fetch brings, together
// and in job-id order, before River hands them to its goroutines: a job
// of a limited kind takes a leased slot, a slot of the line, or its place
// in the line, or parks at once, never seen by River's executors. Without
// it the middleware decides each job alone, in the order Go schedules
// their goroutines. Every other call of the driver is River's own.
func (l *Limiter) Driver(d *riverpgxv5.Driver, kinds []string) riverdriver.Driver[pgx.Tx] {
	return &fetchDriver{Driver: d, l: l, kinds: slices.Clone(kinds)}
}

// fetchDriver is River's pgx driver whose executors decide what they fetch.
type fetchDriver struct {
	*riverpgxv5.Driver
	l     *Limiter
	kinds []string
}

// GetExecutor returns River's executor, watched.
func (d *fetchDriver) GetExecutor() riverdriver.Executor {
	return &fetchExecutor{Executor: d.Driver.GetExecutor(), d: d}
}

// fetchExecutor is River's executor whose fetches the limiter decides.
type fetchExecutor struct {
	riverdriver.Executor
	d *fetchDriver
}

// JobGetAvailable fetches as River does, at most what the fetch gate lets
// in, and has the limiter decide the jobs of limited kinds. The jobs that
// parked leave the result; while a full fetch lost jobs to parking, it
// fetches again for them (River fetches again at once only after a full
// fetch).
func (e *fetchExecutor) JobGetAvailable(ctx context.Context, params *riverdriver.JobGetAvailableParams) (*riverdriver.JobGetAvailableResult, error) {
	l := e.d.l
	params = l.gate.admit(ctx, params)
	want := params.MaxToLock
	out := &riverdriver.JobGetAvailableResult{}
	for range maxFetchThrough {
		p := *params
		p.MaxToLock = want - len(out.Jobs)
		res, err := e.Executor.JobGetAvailable(ctx, &p)
		if err != nil {
			if len(out.Jobs) > 0 {
				return out, nil // River gets what it has; the error comes back at its next fetch
			}
			return res, err
		}
		if res == nil || len(res.Jobs) == 0 {
			break
		}
		parked := l.fetched(ctx, res.Jobs, res.DecodeErrors, e.d.kinds)
		for _, job := range res.Jobs {
			if parked[job.ID] {
				continue
			}
			out.Jobs = append(out.Jobs, job)
			if err := res.DecodeErrors[job.ID]; err != nil {
				if out.DecodeErrors == nil {
					out.DecodeErrors = map[int64]error{}
				}
				out.DecodeErrors[job.ID] = err
			}
		}
		if len(res.Jobs) < p.MaxToLock || len(parked) == 0 || l.isStopped() {
			break
		}
	}
	return out, nil
}

// fetched decides the fetched jobs of kinds (those of limited kinds) and
// returns those that parked. A decision that fails leaves its jobs to the
// middleware.
func (l *Limiter) fetched(ctx context.Context, jobs []*rivertype.JobRow, decodeErrs map[int64]error, kinds []string) map[int64]bool {
	if l.ignoreLimits || l.neverPark || l.isStopped() {
		return nil
	}
	mine := make([]*rivertype.JobRow, 0, len(jobs))
	for _, job := range jobs {
		if job.Kind != ResumeKind && decodeErrs[job.ID] == nil && slices.Contains(kinds, job.Kind) {
			mine = append(mine, job)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	gone, err := l.admit(ctx, mine, false)
	if err != nil {
		l.logger.Warn("concurrency limits: fetched jobs not decided at their fetch; deciding them in the middleware", "error", err)
	}
	parked := map[int64]bool{}
	for id, d := range gone {
		if d.Action == ledger.Parked || d.Action == ledger.StepBack {
			parked[id] = true
		}
	}
	// What goes to River undecided (no limit now) is decided in the
	// middleware, together and in order, if a limit comes meanwhile.
	var undecided []*rivertype.JobRow
	for _, job := range mine {
		if q := l.queues.get(job.Kind); !parked[job.ID] && (q == nil || q.Get(job.ID) == nil) {
			undecided = append(undecided, job)
		}
	}
	l.strays.add(undecided)
	return parked
}
