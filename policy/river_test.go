package policy_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/policy"
)

// Discard through River's client is River's own duplicate answer: the
// waiting job's row, UniqueSkippedAsDuplicate; other keys are untouched.
func TestDiscardAnswersWithTheWaitingJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard})

	first := e.insert(t, "acme", 1)
	require.False(t, first.UniqueSkippedAsDuplicate)
	second := e.insert(t, "acme", 2)
	require.True(t, second.UniqueSkippedAsDuplicate)
	require.Equal(t, first.Job.ID, second.Job.ID)
	require.JSONEq(t, `{"tenant": "acme", "seq": 1}`, string(second.Job.EncodedArgs), "discard keeps the waiting job's args")
	other := e.insert(t, "globex", 3)
	require.False(t, other.UniqueSkippedAsDuplicate)

	require.Equal(t, 1, e.waiting(t, "acme"))
	waiting, inserted, discarded, _, _ := e.keyRow(t, `"acme"`)
	require.Equal(t, []int64{1, 1, 1}, []int64{waiting, inserted, discarded})
}

// Replace gives the newest waiting job the new args and scheduled_at; it
// keeps its id and attempt, and says so in its metadata.
func TestReplaceKeepsTheIDAndTakesTheNewArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Replace})

	first := e.insert(t, "acme", 1)
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	second, err := e.client.Insert(ctx, syncArgs{Tenant: "acme", Seq: 2}, &river.InsertOpts{ScheduledAt: at})
	require.NoError(t, err)
	require.True(t, second.UniqueSkippedAsDuplicate)
	require.Equal(t, first.Job.ID, second.Job.ID)
	require.JSONEq(t, `{"tenant": "acme", "seq": 2}`, string(second.Job.EncodedArgs))
	require.Equal(t, "scheduled", string(second.Job.State))
	near(t, at, second.Job.ScheduledAt, time.Millisecond)

	var meta map[string]map[string]any
	require.NoError(t, json.Unmarshal(second.Job.Metadata, &meta))
	require.EqualValues(t, 1, meta["sluice_policy"]["replaces"])
	require.Equal(t, "replaced", meta["sluice_policy"]["last_outcome"])
	require.Equal(t, 1, e.waiting(t, "acme"))
	_, inserted, _, replaced, _ := e.keyRow(t, `"acme"`)
	require.Equal(t, []int64{1, 1}, []int64{inserted, replaced})
}

// Debounce moves the job to now + D on each enqueue, never past its first
// waiting time + M; the job stays available (River fetches it once due).
func TestDebounceNeverPastMaxDelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.set(t, policy.Policy{MaxWaiting: 1, OnConflict: policy.Debounce, Debounce: 2 * time.Second, MaxDelay: 3 * time.Second})

	start := time.Now()
	first := e.insert(t, "acme", 1)
	require.Equal(t, "available", string(first.Job.State))
	near(t, start.Add(2*time.Second), first.Job.ScheduledAt, 300*time.Millisecond)

	time.Sleep(700 * time.Millisecond)
	second := e.insert(t, "globex", 2) // no --by-args: one key for the kind
	require.Equal(t, first.Job.ID, second.Job.ID)
	require.JSONEq(t, `{"tenant": "globex", "seq": 2}`, string(second.Job.EncodedArgs))
	near(t, time.Now().Add(2*time.Second), second.Job.ScheduledAt, 300*time.Millisecond)

	time.Sleep(700 * time.Millisecond)
	third := e.insert(t, "initech", 3)
	// now + 2s would be start + 3.4s: capped at first waiting + 3s.
	near(t, first.Job.CreatedAt.Add(3*time.Second), third.Job.ScheduledAt, 50*time.Millisecond)
	_, inserted, _, _, debounced := e.keyRow(t, "")
	require.Equal(t, []int64{1, 2}, []int64{inserted, debounced})
}

// Reject fails the insert with SLR01 naming kind, key and count; in a
// transaction, the transaction is aborted unless a savepoint held the
// insert.
func TestRejectFailsTheInsertAndItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 2, OnConflict: policy.Reject})
	e.insert(t, "acme", 1)
	e.insert(t, "acme", 2)

	_, err := e.client.Insert(ctx, syncArgs{Tenant: "acme", Seq: 3}, nil)
	pgErr, ok := policy.AsRejected(err)
	require.True(t, ok, "%v", err)
	require.Contains(t, pgErr.Message, "policy.sync")
	require.Contains(t, pgErr.Message, `"acme"`)
	require.Contains(t, pgErr.Message, "2 waiting")
	_, refused := policy.AsRefused(err)
	require.False(t, refused)
	require.Equal(t, 2, e.waiting(t, "acme"))

	// In a transaction: the transaction is aborted.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = e.client.InsertTx(ctx, tx, syncArgs{Tenant: "acme", Seq: 4}, nil)
	_, ok = policy.AsRejected(err)
	require.True(t, ok)
	_, err = tx.Exec(ctx, "SELECT 1")
	var pgErr2 *pgconn.PgError
	require.True(t, errors.As(err, &pgErr2))
	require.Equal(t, "25P02", pgErr2.Code, "in failed transaction")
	require.NoError(t, tx.Rollback(ctx))

	// With a savepoint, the rest of the transaction goes on.
	tx, err = e.pool.Begin(ctx)
	require.NoError(t, err)
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = e.client.InsertTx(ctx, sp, syncArgs{Tenant: "acme", Seq: 5}, nil)
	_, ok = policy.AsRejected(err)
	require.True(t, ok)
	require.NoError(t, sp.Rollback(ctx))
	_, err = e.client.InsertTx(ctx, tx, syncArgs{Tenant: "globex", Seq: 6}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, e.waiting(t, "globex"))
}

// InsertMany under a cap of one (where the trigger looks for the waiting
// job that answers before it counts): a row of a full key is answered by
// its waiting job, and a second row of that key in the same InsertMany,
// whose only waiting job the statement answered with or inserted itself,
// is refused (SLR02), never Postgres's "cannot affect row a second time".
func TestInsertManyUnderACapOfOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard})
	a1 := e.insert(t, "acme", 1)

	res, err := e.client.InsertMany(ctx, []river.InsertManyParams{
		{Args: syncArgs{Tenant: "globex", Seq: 2}}, {Args: syncArgs{Tenant: "acme", Seq: 3}}, {Args: syncArgs{Tenant: "initech", Seq: 4}},
	})
	require.NoError(t, err)
	require.False(t, res[0].UniqueSkippedAsDuplicate)
	require.True(t, res[1].UniqueSkippedAsDuplicate)
	require.Equal(t, a1.Job.ID, res[1].Job.ID, "the waiting job answers")
	require.False(t, res[2].UniqueSkippedAsDuplicate)

	for _, rows := range [][]river.InsertManyParams{
		{{Args: syncArgs{Tenant: "acme", Seq: 5}}, {Args: syncArgs{Tenant: "acme", Seq: 6}}},   // answered, then again
		{{Args: syncArgs{Tenant: "hooli", Seq: 7}}, {Args: syncArgs{Tenant: "hooli", Seq: 8}}}, // inserted, then full
		{{Args: syncArgs{Tenant: "umbrella", Seq: 9}}, {Args: syncArgs{Tenant: "acme", Seq: 10}}, // the statement's
			{Args: syncArgs{Tenant: "umbrella", Seq: 11}}}, // first row inserted, its second answered: its third
	} {
		_, err = e.client.InsertMany(ctx, rows)
		pgErr, ok := policy.AsRefused(err)
		require.True(t, ok, "%v", err)
		require.Contains(t, pgErr.Message, "InsertMany")
	}
	require.Equal(t, 1, e.waiting(t, "acme"))
	require.Zero(t, e.waiting(t, "hooli"), "nothing of a failed InsertMany stays")
	require.Zero(t, e.waiting(t, "umbrella"))
}

// InsertMany: each row meets the policy, in order; two rows of one full
// key in one InsertMany are refused (SLR02) when the key has fewer waiting
// jobs to answer with, as River itself fails on two rows of one unique key.
func TestInsertMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 2, OnConflict: policy.Replace})
	a1 := e.insert(t, "acme", 1)
	a2 := e.insert(t, "acme", 2)

	res, err := e.client.InsertMany(ctx, []river.InsertManyParams{
		{Args: syncArgs{Tenant: "acme", Seq: 3}}, {Args: syncArgs{Tenant: "globex", Seq: 4}}, {Args: syncArgs{Tenant: "acme", Seq: 5}},
	})
	require.NoError(t, err)
	require.Len(t, res, 3)
	require.True(t, res[0].UniqueSkippedAsDuplicate)
	require.Equal(t, a2.Job.ID, res[0].Job.ID, "the newest waiting job answers first")
	require.False(t, res[1].UniqueSkippedAsDuplicate)
	require.True(t, res[2].UniqueSkippedAsDuplicate)
	require.Equal(t, a1.Job.ID, res[2].Job.ID, "a row answers once per statement: the next newest")
	require.Equal(t, 2, e.waiting(t, "acme"))

	_, err = e.client.InsertMany(ctx, []river.InsertManyParams{
		{Args: syncArgs{Tenant: "acme", Seq: 6}}, {Args: syncArgs{Tenant: "acme", Seq: 7}}, {Args: syncArgs{Tenant: "acme", Seq: 8}},
	})
	pgErr, ok := policy.AsRefused(err)
	require.True(t, ok, "%v", err)
	require.Contains(t, pgErr.Message, "InsertMany")
	require.Equal(t, 3, e.count(t, `SELECT count(*) FROM river_job WHERE kind = 'policy.sync'`), "nothing of the failed InsertMany stays")

	// InsertManyFast (COPY, no answer per row): a conflicting row is not
	// inserted, its replace applied; the count says what was inserted.
	n, err := e.client.InsertManyFast(ctx, []river.InsertManyParams{
		{Args: syncArgs{Tenant: "acme", Seq: 9}}, {Args: syncArgs{Tenant: "initech", Seq: 10}},
	})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE kind = 'policy.sync' AND args->>'seq' = '9'`))
	require.Equal(t, 2, e.waiting(t, "acme"))
}

// Inserts racing on one key: the cap holds, and every answer names the one
// waiting job.
func TestRacingInsertsKeepTheCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard})

	const n = 16
	ids := make([]int64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.client.Insert(context.Background(), syncArgs{Tenant: "acme", Seq: i}, nil)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = res.Job.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
	require.Equal(t, 1, e.waiting(t, "acme"))
	_, inserted, discarded, _, _ := e.keyRow(t, `"acme"`)
	require.Equal(t, []int64{1, n - 1}, []int64{inserted, discarded})
}

// A rolled-back insert leaves nothing: no job, no count, and the next
// insert of the key is inserted.
func TestRolledBackInsertLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Replace})
	e.insert(t, "globex", 1)

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = e.client.InsertTx(ctx, tx, syncArgs{Tenant: "acme", Seq: 1}, nil)
	require.NoError(t, err)
	_, err = e.client.InsertTx(ctx, tx, syncArgs{Tenant: "acme", Seq: 2}, nil) // replaces the first, in the same transaction
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	require.Zero(t, e.waiting(t, "acme"))
	require.Zero(t, e.count(t, `SELECT count(*) FROM enqueue_policy_counts WHERE key = '"acme"'`))
	res := e.insert(t, "acme", 3)
	require.False(t, res.UniqueSkippedAsDuplicate)
}

// A running job is never touched: it does not count as waiting, and an
// insert of its key goes in as a new job while it keeps its args.
func TestRunningJobIsNeverTouched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Replace})
	first := e.insert(t, "acme", 1)
	_, err := e.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1`, first.Job.ID)
	require.NoError(t, err)

	second := e.insert(t, "acme", 2)
	require.False(t, second.UniqueSkippedAsDuplicate)
	require.NotEqual(t, first.Job.ID, second.Job.ID)
	third := e.insert(t, "acme", 3)
	require.Equal(t, second.Job.ID, third.Job.ID)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE id = $1 AND args->>'seq' = '1' AND state = 'running'`, first.Job.ID))

	// Failing back to retryable, it waits again, beside the newer job: the
	// two keys of sluice's never collide (River's scheduler discards
	// neither).
	_, err = e.pool.Exec(ctx, `UPDATE river_job SET state = 'retryable', scheduled_at = now() WHERE id = $1`, first.Job.ID)
	require.NoError(t, err)
	require.Equal(t, 2, e.waiting(t, "acme"))
}

// A replace that would move a parked job to another limit key is refused
// (SLR02); one that keeps the key is carried out.
func TestReplaceOfAParkedJobKeepsItsLimitKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	_, err := e.pool.Exec(ctx, `INSERT INTO concurrency_limits (kind, max_concurrency, partition_fields, key_max) VALUES ('policy.sync', 0, '{tenant}', 1)`)
	require.NoError(t, err)
	e.set(t, policy.Policy{MaxWaiting: 1, OnConflict: policy.Replace}) // one key for the kind
	first := e.insert(t, "acme", 1)
	_, err = e.pool.Exec(ctx, `UPDATE river_job SET state = 'pending' WHERE id = $1`, first.Job.ID)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, key) VALUES ($1, 'policy.sync', 'key_limit', '"acme"')`, first.Job.ID)
	require.NoError(t, err)

	_, err = e.client.Insert(ctx, syncArgs{Tenant: "globex", Seq: 2}, nil)
	pgErr, ok := policy.AsRefused(err)
	require.True(t, ok, "%v", err)
	require.Contains(t, pgErr.Message, `from "acme" to "globex"`)

	res := e.insert(t, "acme", 3)
	require.Equal(t, first.Job.ID, res.Job.ID)
	require.Equal(t, "pending", string(res.Job.State), "a parked job stays parked")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1`, first.Job.ID))
}

// River's unique jobs follow River's uniqueness, not the policy.
func TestRiverUniqueJobsFollowRiver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Reject})
	opts := &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
	_, err := e.client.Insert(ctx, syncArgs{Tenant: "acme", Seq: 1}, opts)
	require.NoError(t, err)
	res, err := e.client.Insert(ctx, syncArgs{Tenant: "acme", Seq: 1}, opts)
	require.NoError(t, err)
	require.True(t, res.UniqueSkippedAsDuplicate)
	_, err = e.client.Insert(ctx, syncArgs{Tenant: "acme", Seq: 2}, opts)
	require.NoError(t, err, "not counted by the policy")
}

// Under REPEATABLE READ, an insert whose key another transaction inserted
// into after the caller's snapshot fails with a serialization error
// (40001) instead of counting from a stale snapshot.
func TestRepeatableReadInsertFailsToSerialize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard})
	e.insert(t, "acme", 1) // the key's row exists

	tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx)            //nolint:errcheck // test cleanup
	_, err = tx.Exec(ctx, "SELECT 1") // the snapshot
	require.NoError(t, err)
	e.insert(t, "acme", 2) // commits after the snapshot: discarded, counted
	_, err = e.client.InsertTx(ctx, tx, syncArgs{Tenant: "acme", Seq: 3}, nil)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "40001", pgErr.Code)
}

// A waiting job fetched while an insert is deciding: the insert waits for
// the fetch's lock, sees the job running, and goes in as a new job with
// the new args; the running job keeps its own.
func TestReplaceOfAJobFetchedMeanwhileInsertsANewJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Replace})
	first := e.insert(t, "acme", 1)

	// A fetch in progress, as River's: the row locked, then made running.
	fetch, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer fetch.Rollback(ctx) //nolint:errcheck // test cleanup
	_, err = fetch.Exec(ctx, `SELECT id FROM river_job WHERE id = $1 FOR UPDATE SKIP LOCKED`, first.Job.ID)
	require.NoError(t, err)
	_, err = fetch.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1`, first.Job.ID)
	require.NoError(t, err)

	type result struct {
		res *rivertype.JobInsertResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := e.client.Insert(ctx, syncArgs{Tenant: "acme", Seq: 2}, nil)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the insert did not wait for the fetch: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, fetch.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.False(t, r.res.UniqueSkippedAsDuplicate)
	require.NotEqual(t, first.Job.ID, r.res.Job.ID)
	require.JSONEq(t, `{"tenant": "acme", "seq": 2}`, string(r.res.Job.EncodedArgs))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'running' AND args->>'seq' = '1'`, first.Job.ID))
	require.Equal(t, 1, e.waiting(t, "acme"))
}

// Replace with KeepScheduledAt: the waiting job takes the new args and
// keeps its own scheduled_at, through River's client and plain SQL.
func TestReplaceKeepingScheduledAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Replace, KeepScheduledAt: true})
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	first, err := e.client.Insert(ctx, syncArgs{Tenant: "acme", Seq: 1}, &river.InsertOpts{ScheduledAt: at})
	require.NoError(t, err)
	second := e.insert(t, "acme", 2) // due now, were it inserted
	require.Equal(t, first.Job.ID, second.Job.ID)
	require.JSONEq(t, `{"tenant": "acme", "seq": 2}`, string(second.Job.EncodedArgs))
	require.Equal(t, "scheduled", string(second.Job.State))
	near(t, at, second.Job.ScheduledAt, time.Millisecond)

	_, err = e.pool.Exec(ctx, `INSERT INTO river_job (kind, args, max_attempts) VALUES ('policy.sync', '{"tenant": "acme", "seq": 3}', 5)`)
	require.NoError(t, err)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE id = $1 AND args->>'seq' = '3' AND state = 'scheduled'
		AND abs(extract(epoch FROM scheduled_at - $2::timestamptz)) < 0.001`, first.Job.ID, at))
}
