package app_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// queueCheck returns the check called name of a health report.
func queueCheck(t *testing.T, r *app.HealthReport, name string) app.HealthCheck {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %s in %+v", name, r.Checks)
	return app.HealthCheck{}
}

func execAll(t *testing.T, pool *pgxpool.Pool, sqls ...string) {
	t.Helper()
	for _, sql := range sqls {
		_, err := pool.Exec(context.Background(), sql)
		require.NoError(t, err, sql)
	}
}

// TestHealthUnservedQueues: a queue with available jobs that no live worker
// serves is a WARNING naming it. A worker's row says which queues it serves
// (a row without them, from an older sluice, serves default and
// maintenance); a worker that is not live serves nothing; jobs not
// available (scheduled) and the private queues of `sluice run` do not
// count.
func TestHealthUnservedQueues(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	check := func() (*app.HealthReport, app.HealthCheck) {
		t.Helper()
		r, err := app.CheckHealth(ctx, url, pgkit.Schemas{})
		require.NoError(t, err)
		return r, queueCheck(t, r, "unserved_queues")
	}
	execAll(t, pool,
		// A live worker (and dispatcher) serving default and maintenance.
		`INSERT INTO sluice_workers (id, host, pid, heartbeat_interval, poll_interval, dispatcher_tick_at, queues)
		 VALUES ('serves-default', 'h', 1, '1h', '1h', now(), '{"default": 5, "maintenance": 1}')`,
		`INSERT INTO river_job (kind, args, queue, state) VALUES ('demo.sleep', '{}', 'default', 'available')`,
		`INSERT INTO river_job (kind, args, queue, state, scheduled_at) VALUES ('demo.sleep', '{}', 'later', 'scheduled', now() + interval '1 hour')`,
		`INSERT INTO river_job (kind, args, queue, state) VALUES ('demo.sleep', '{}', 'sluice_run_0a1b2c', 'available')`)
	r, c := check()
	require.Equal(t, app.HealthOK, r.Status, r.Summary())
	require.Equal(t, "none", c.Message)
	require.Contains(t, r.Summary(), "unserved_queues=0 paused_queues=0")

	execAll(t, pool,
		`INSERT INTO river_job (kind, args, queue, state) VALUES ('demo.sleep', '{}', 'emails', 'available'), ('demo.sleep', '{}', 'emails', 'available')`,
		// Neither serves emails: a worker gone silent a day ago, and one
		// whose row records no queues.
		`INSERT INTO sluice_workers (id, host, pid, heartbeat_interval, heartbeat_at, queues)
		 VALUES ('silent', 'h', 2, '1s', now() - interval '1 day', '{"emails": 5}')`,
		`INSERT INTO sluice_workers (id, host, pid, heartbeat_interval) VALUES ('older', 'h', 3, '1h')`,
		`INSERT INTO river_job (kind, args, queue, state) VALUES ('demo.sleep', '{}', 'maintenance', 'available')`)
	r, c = check()
	require.Equal(t, app.HealthWarning, c.Status)
	require.Regexp(t, `^1 with available jobs that no live worker serves \(start a worker with --queues\): emails \(2 available, oldest waiting \S+\)$`, c.Message)
	require.Equal(t, int64(1), r.UnservedQueues)
	require.Equal(t, []string{"emails"}, r.UnservedQueueNames)
	require.Contains(t, r.Summary(), "unserved_queues=1")

	// The older worker serves default: with the first one gone, default is
	// still served.
	execAll(t, pool, `DELETE FROM sluice_workers WHERE id = 'serves-default'`,
		`UPDATE sluice_workers SET poll_interval = '1h', dispatcher_tick_at = now() WHERE id = 'older'`)
	_, c = check()
	require.Regexp(t, `^1 with .*: emails \(2 available`, c.Message)

	// A River client that reported emails long ago does not serve it; one
	// that reported it within the last 15 minutes (a queue added to a
	// running client, a plain River client) does.
	execAll(t, pool, `INSERT INTO river_queue (name, metadata, created_at, updated_at)
		VALUES ('emails', '{}', now() - interval '1 day', now() - interval '20 minutes')`)
	_, c = check()
	require.Regexp(t, `^1 with .*: emails \(2 available`, c.Message)
	execAll(t, pool, `UPDATE river_queue SET updated_at = now() - interval '5 minutes' WHERE name = 'emails'`)
	r, c = check()
	require.Equal(t, app.HealthOK, c.Status, r.Summary())
	execAll(t, pool, `DELETE FROM river_queue WHERE name = 'emails'`)

	// A live worker serving emails clears it.
	execAll(t, pool, `UPDATE sluice_workers SET heartbeat_at = now(), heartbeat_interval = '1h' WHERE id = 'silent'`)
	r, c = check()
	require.Equal(t, app.HealthOK, c.Status, r.Summary())
}

// TestHealthPausedQueues: a queue paused longer than the setting
// health.queue_paused_after (default 1h) is a WARNING naming it; "0s" turns
// the check off; a malformed setting is a WARNING naming the key.
func TestHealthPausedQueues(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	check := func() (*app.HealthReport, app.HealthCheck) {
		t.Helper()
		r, err := app.CheckHealth(ctx, url, pgkit.Schemas{})
		require.NoError(t, err)
		return r, queueCheck(t, r, "paused_queues")
	}
	execAll(t, pool,
		`INSERT INTO sluice_workers (id, host, pid, heartbeat_interval, poll_interval, dispatcher_tick_at, queues)
		 VALUES ('w', 'h', 1, '1h', '1h', now(), '{"default": 5, "emails": 1, "maintenance": 1}')`,
		`INSERT INTO river_queue (name, paused_at, updated_at) VALUES
		 ('emails', now() - interval '2 hours', now()), ('default', now() - interval '5 minutes', now()), ('reports', NULL, now())`,
		`INSERT INTO river_job (kind, args, queue, state) VALUES ('demo.sleep', '{}', 'emails', 'available')`)

	r, c := check()
	require.Equal(t, app.HealthWarning, r.Status, r.Summary())
	require.Regexp(t, "^1 paused longer than 1h \\(`sluice queues resume QUEUE`\\): emails \\(paused 2h\\S* ago, 1 available\\)$", c.Message)
	require.Equal(t, []string{"emails"}, r.PausedQueueNames)
	require.Equal(t, float64(3600), r.PausedAfterSeconds)

	execAll(t, pool, `UPDATE settings SET value = '"1m"' WHERE key = 'health.queue_paused_after'`)
	r, c = check()
	require.Regexp(t, `^2 paused longer than 1m .*: emails \(paused .*\), default \(paused 5m\S* ago, 0 available\)$`, c.Message)
	require.Equal(t, int64(2), r.PausedQueues)

	execAll(t, pool, `UPDATE settings SET value = '"0s"' WHERE key = 'health.queue_paused_after'`)
	r, c = check()
	require.Equal(t, app.HealthOK, r.Status, r.Summary())
	require.Equal(t, "not checked (health.queue_paused_after is 0)", c.Message)

	execAll(t, pool, `UPDATE settings SET value = '"soon"' WHERE key = 'health.queue_paused_after'`)
	_, c = check()
	require.Equal(t, app.HealthWarning, c.Status)
	require.Contains(t, c.Message, "health.queue_paused_after")
}
