// Package torture is the limiter's model-based torture test: two or three
// real worker processes on one Postgres work jobs of two test kinds while a
// seeded random schedule inserts jobs (bursts and trickles, skewed keys),
// sets, raises, lowers, breaks and clears per-kind, per-key and rate limits,
// cancels, deletes and retries waiting jobs through River's client, and
// stops and kills (SIGKILL) workers. Each real execution is recorded in its
// worker's run log (a file of JSON lines, each written as it happens, so a
// killed worker loses none), every state change of the jobs and every
// limit change by triggers (torture_states, torture_limits); when the
// schedule ends, the checks read that record alone and verify the limiter's
// promises together: the limits held at every start, no rate window held
// more starts than its rate, jobs of a key started in job-id order, no job
// waited long while its limits had room, every job ended as River documents,
// resumes stayed within what the limits let start, and the limiter's
// counters equal a recount.
//
// `make test` runs it for about 30 s (TORTURE_DURATION, a Go duration,
// changes the budget); `make torture` runs seeds for as long as asked.
// TORTURE_SEED replays one seed's schedule.
package torture
