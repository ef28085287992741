package db

// SchedulerPeekSQL is the text of SchedulerPeek, the schedule dispatcher's
// idle check, for EXPLAIN in tests and benchmarks.
const SchedulerPeekSQL = schedulerPeek
