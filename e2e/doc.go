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
//     each completed once, none lost or left parked (TestLoadThroughLimit).
//
// Each test has a database of its own (internal/testdb); TestPostgresRestart
// owns a private cluster (internal/pgcluster). The benchmarks of this package
// measure no-op throughput: raw River, a `sluice worker` process, and asynq
// on Redis, the alternative sluice replaces.
package e2e
