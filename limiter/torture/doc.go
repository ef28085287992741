// Package torture is the limiter's model-based torture test: two or three
// real worker processes on one Postgres work jobs of two test kinds while a
// seeded random schedule inserts jobs (bursts and trickles, skewed keys),
// sets, raises, lowers, breaks and clears per-kind, per-key and rate limits,
// cancels, deletes and retries waiting jobs through River's client, and
// stops and kills (SIGKILL) workers.
//
// The schedule is drawn from the seed alone, before the run, and logged:
// TORTURE_SEED=N replays the same operations at the same offsets. For
// diagnosis, TORTURE_DUMP=1 logs every job's record, TORTURE_DEBUG=1 makes
// the workers log the limiter's rounds, TORTURE_WORKER_LOGS=DIR keeps
// each worker's log in DIR/<test>/<worker>.log (a directory per seed), and
// TORTURE_FAILED_LOGS=DIR does both for the seeds that fail only, in
// DIR/seed-N/<worker>.log.
//
// The checks read an independent record only: each real execution from
// its worker's run log (a file of JSON lines, each written as it happens,
// so a killed worker loses none; with the slot the limiter let it start
// on, limiter.AdmissionFrom), River's state history of every job and
// the history of the limits (by triggers), and what the test itself did
// (inserts, River client calls, worker events, accounting samples). The
// limiter's own tables may explain a violation in its report, never excuse
// one (they, and a run's leased slot, only turn an exemption into a
// judgment). They verify the README's promises table together: the limits held
// at every start; no rate window held more starts than its rate; order
// within a key (strict under a per-key or rate limit, by fetch under a
// per-kind limit alone); fairness across keys; no key waited long while
// its limits had room; nothing lost, nothing twice; no thundering herd;
// and the slots counted equal the jobs working. Each check counts the
// events it judged and those it exempted, with why, and a check that
// exempted more than 10 % of its candidates fails as starved.
//
// `make torture` runs the scenarios and then seeds for TORTURE_DURATION
// (a Go duration) and prints the coverage table; `make torture-corpus` runs
// every seed that ever caught a bug. `make test` runs the checks on
// hand-written records, each of which must find its broken promise, and
// the schedule's replay with the suite, then 30 s of seeds against real
// workers on their own (TORTURE_DURATION=30s).
package torture
