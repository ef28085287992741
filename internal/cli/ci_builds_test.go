package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestRunDropCancelingBuilds runs `sluice run ci.drop_canceling_builds` end
// to end through the binary: it drops the stuck builds, prints the
// maintenance run's outcome, rejects args, and is skipped while another
// session holds the kind's lock.
func TestRunDropCancelingBuilds(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `
		INSERT INTO ci_builds (project_id, pipeline_id, status, created_at, updated_at)
		SELECT 1, g, 'canceling', now() - interval '2 hours', now() - interval '2 hours'
		FROM generate_series(1, 3) AS g;
		INSERT INTO ci_builds (project_id, pipeline_id, status, created_at, updated_at)
		VALUES (1, 4, 'canceling', now() - interval '2 hours', now() - interval '5 minutes')`)
	require.NoError(t, err)

	code, out := sluice(t, url, "run", "ci.drop_canceling_builds")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `^ci\.drop_canceling_builds job \d+ completed in \S+; maintenance run \d+ succeeded, affected 3\n$`, out)
	var failed, canceling int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'failed' AND failure_reason = 'stuck_or_timeout_failure'),
		       count(*) FILTER (WHERE status = 'canceling')
		FROM ci_builds`).Scan(&failed, &canceling))
	require.Equal(t, 3, failed)
	require.Equal(t, 1, canceling)

	code, out = sluice(t, url, "run", "ci.drop_canceling_builds")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `; maintenance run \d+ succeeded, affected 0\n$`, out)

	sum := testdb.Checksum(t, pool, "ci_builds", "maintenance_runs")
	code, out = sluice(t, url, "run", "ci.drop_canceling_builds", "--args", `{"timeout": "1m"}`)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `unknown field "timeout"`)
	require.Equal(t, sum, testdb.Checksum(t, pool, "ci_builds", "maintenance_runs"))

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended('ci.drop_canceling_builds', 0))")
	require.NoError(t, err)
	code, out = sluice(t, url, "run", "ci.drop_canceling_builds")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `; maintenance run \d+ skipped_locked, affected 0\n$`, out)
}

// TestRunDropCancelingBuildsKilled kills `sluice run ci.drop_canceling_builds`
// (SIGKILL) while its second batch is in flight: the first batch stays
// dropped, the second is rolled back, and the next run records the dead run
// as failed and drops the rest, each build exactly once.
func TestRunDropCancelingBuildsKilled(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	if version < 140000 {
		t.Skip("needs client_connection_check_interval (PostgreSQL 14)")
	}
	var stall int64
	require.NoError(t, pool.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO ci_builds (project_id, status, created_at, updated_at)
			SELECT 1, 'canceling', now() - interval '2 days' + g * interval '1 second', now() - interval '2 days'
			FROM generate_series(1, 250) AS g
			RETURNING id)
		SELECT id FROM ins ORDER BY id OFFSET 150 LIMIT 1`).Scan(&stall))
	// The server notices a dead client within 100ms even mid-statement, and
	// the second batch's update stalls on build stall until then.
	_, err = pool.Exec(ctx, fmt.Sprintf(`
		DO $$ BEGIN
			EXECUTE format('ALTER DATABASE %%I SET client_connection_check_interval = 100', current_database());
		END $$;
		CREATE FUNCTION test_stall() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.id = %d AND NEW.status = 'failed' THEN
				PERFORM pg_sleep(600);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_stall BEFORE UPDATE ON ci_builds FOR EACH ROW EXECUTE FUNCTION test_stall();`, stall))
	require.NoError(t, err)

	cmd := exec.Command(sluiceBin, "run", "ci.drop_canceling_builds")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	stalled := func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep'`).Scan(&n))
		return n > 0
	}
	require.Eventually(t, stalled, 60*time.Second, 20*time.Millisecond)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.Eventually(t, func() bool { return !stalled() }, 60*time.Second, 20*time.Millisecond,
		"the server cancels the dead client's statement")

	var failed, running int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM ci_builds WHERE status = 'failed'").Scan(&failed))
	require.Equal(t, 100, failed, "the first batch stays dropped, the second was rolled back")
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM maintenance_runs WHERE status = 'running'").Scan(&running))
	require.Equal(t, 1, running, "the killed run could not record its outcome")

	_, err = pool.Exec(ctx, "DROP TRIGGER test_stall ON ci_builds")
	require.NoError(t, err)
	code, out := sluice(t, url, "run", "ci.drop_canceling_builds")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `; maintenance run \d+ succeeded, affected 150\n$`, out)
	var once int
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT count(*) FROM ci_builds WHERE status = 'failed' AND lock_version = 1").Scan(&once))
	require.Equal(t, 250, once, "each build dropped exactly once")
	var statuses []string
	rows, err := pool.Query(ctx, "SELECT status FROM maintenance_runs ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		statuses = append(statuses, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"failed", "succeeded"}, statuses, "the dead run is closed as failed")
}
