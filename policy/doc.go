// Package policy is the Go side of enqueue policies: what an insert into
// river_job does when its key already has max_waiting jobs waiting
// (discard, replace, debounce, reject).
//
// The policies are rows of sluice's enqueue_policies table and are
// enforced in the database, by the BEFORE INSERT trigger
// sluice_enqueue_policy on river_job, so that every insert path obeys
// them: a sluice worker's River client, a team's own River client on the
// same database, `sluice enqueue`, plain SQL. This package writes and
// reads the rows (Store), declares them from Go (SyncDeclared, the
// schedules' rule: an operator's change wins until Reset), and recognises
// the trigger's errors (AsRejected, AsRefused).
package policy
