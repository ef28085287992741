// Package e2e is sluice's fault and load suite: Go tests that build the real
// `sluice` binary and run it as separate processes against a real Postgres
// server, to prove that sluice keeps its promises when workers crash, the
// database restarts, input is bad or the load is high:
//
//   - several workers dispatch every due time of per-second schedules
//     exactly once, and maintenance runs of a kind never overlap
//     (TestManyWorkers);
//   - a worker killed with SIGKILL in the middle of limited jobs and of a
//     maintenance run loses nothing: the limit still holds, the advisory lock
//     is free, the next run proceeds and River works the killed jobs again
//     (TestKilledWorker);
//   - workers survive a Postgres restart without being restarted themselves,
//     and `sluice health` goes from CRITICAL back to OK with no due time lost
//     beyond the misfire policy (TestPostgresRestart);
//   - every CLI command rejects malformed input with exit 2 (1 for an
//     unreachable database) and a one-line message, and changes nothing
//     (TestBadInputEveryCommand);
//   - 100,000 jobs through a kind limited to 8, worked by two workers, are
//     each completed once, none lost or left parked (TestLoadThroughLimit);
//   - a worker killed with SIGKILL while jobs of a kind limited to 2 park
//     and resume across two workers (some parked, some being parked by the
//     victim, some resumed) loses nothing: the other worker's reaper rescues
//     its jobs and slots, every job is done exactly once, none is left
//     parked, the limit and the slot counts hold in every sample
//     (TestKillDuringParkAndResume);
//   - a Postgres crash and restart in the middle of admissions, parkings and
//     resumes: the workers reconnect on their own, nobody is reaped, every
//     job is done exactly once (its code run once), none lost, limit and
//     slot counts intact (TestPostgresRestartDuringAdmission);
//   - a worker whose main pool is exhausted (pool_max_conns=4, every
//     connection held by an export waiting on a lock) for several times its
//     dead-after is not reaped by the other worker, which works the jobs
//     meanwhile; once released it finishes its exports, each once, nothing
//     lost (TestPoolExhaustion).
//
// The last three log the jobs in, done exactly once and lost, and the time
// to recover (BENCHMARKS.md, Reliability). "Exactly once" is counted per
// River row, since a parked job is the same row (parking in place): one
// change of state to completed (test_audit, a trigger the tests install),
// written by the worker running the job's last attempt.
//
// Each test has a database of its own (internal/testdb); TestPostgresRestart
// and TestPostgresRestartDuringAdmission own a private cluster
// (internal/pgcluster) and are skipped without Postgres' server binaries. The benchmarks of this package
// measure no-op throughput: raw River, a `sluice worker` process, and asynq
// on Redis, the alternative sluice replaces.
package e2e
