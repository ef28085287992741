package cli

import (
	"fmt"
	"io/fs"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/migrations"
)

// TestMigrateDownEveryStep rolls sluice's migrations back one at a time with
// `migrate down`, as an operator stepping back does, down to none, then
// applies them again with `migrate up`: with no worker row, with a dead
// worker's row and with a live worker's row. The check for live workers
// reads every version of sluice_workers (dead_after came with 00007): no step
// is an SQL error; a live worker's row refuses each step while its table is
// there (exit 1, naming the worker, nothing rolled back) and --force takes
// the step; a dead worker's row never refuses.
func TestMigrateDownEveryStep(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		row   string
		alive bool
	}{
		{name: "no worker"},
		{name: "dead worker", row: `INSERT INTO sluice.sluice_workers (id, host, pid, heartbeat_interval, dead_after, heartbeat_at)
			VALUES ('w-dead', 'h1', 11, interval '5 seconds', interval '30 seconds', now() - interval '1 day')`},
		// Alive by every version's rule: younger than its dead_after, and
		// than three heartbeat intervals (the rule before dead_after).
		{name: "live worker", alive: true, row: `INSERT INTO sluice.sluice_workers (id, host, pid, heartbeat_interval, dead_after, heartbeat_at)
			VALUES ('w-live', 'h2', 22, interval '1 hour', interval '3 hours', now())`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := testdb.New(t)
			pool := livePool(t, url)
			addRow := func() {
				t.Helper()
				if tc.row != "" {
					_, err := pool.Exec(t.Context(), tc.row)
					require.NoError(t, err)
				}
			}
			workerTable := func() bool {
				return qInt(t, pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass('sluice.sluice_workers')`) == 1
			}
			version := func() int {
				return qInt(t, pool, `SELECT COALESCE(max(version_id), 0)::int FROM sluice.goose_db_version`)
			}
			refused := func(args ...string) {
				t.Helper()
				before := testdb.Checksum(t, pool, "sluice.goose_db_version")
				code, stdout, stderr := runCLI(t, append([]string{"--database-url", url}, args...)...)
				require.Equal(t, 1, code, "%s%s", stdout, stderr)
				require.Equal(t, "sluice: 1 worker(s) of this database are alive: w-live (h2, pid 22); stop them before rolling back, or give --force\n", stderr)
				require.Empty(t, stdout)
				require.Equal(t, before, testdb.Checksum(t, pool, "sluice.goose_db_version"), "a refused rollback changes nothing")
			}
			addRow()
			newest := version()

			steps := 0
			for {
				from := version()
				args := []string{"--database-url", url, "migrate", "down"}
				if tc.alive && workerTable() {
					refused("migrate", "down")
					args = append(args, "--force")
				}
				code, stdout, stderr := runCLI(t, args...)
				require.Equal(t, 0, code, "down from version %d: %s", from, stderr)
				require.Empty(t, stderr)
				if from == 0 {
					require.Equal(t, "nothing to roll back\n", stdout)
					break
				}
				steps++
				require.Regexp(t, regexp.MustCompile(fmt.Sprintf(`^sluice\s+down\s+%d \S+\.sql \(.*\)\n$`, from)), stdout)
				require.Less(t, version(), from)
			}
			require.Equal(t, len(files), steps, "one step per migration of sluice's")
			require.False(t, workerTable())

			code, stdout, stderr := runCLI(t, "--database-url", url, "migrate", "up")
			require.Equal(t, 0, code, stderr)
			require.Len(t, regexp.MustCompile(`(?m)^sluice\s+up\s+\d+ `).FindAllString(stdout, -1), len(files), stdout)
			code, stdout, stderr = runCLI(t, "--database-url", url, "migrate", "status")
			require.Equal(t, 0, code, stderr)
			require.NotRegexp(t, `(?m)^\S+\s+pending`, stdout)

			// Back at the newest version, the check holds as before.
			addRow()
			if tc.alive {
				refused("migrate", "down")
				return
			}
			code, stdout, stderr = runCLI(t, "--database-url", url, "migrate", "down")
			require.Equal(t, 0, code, stderr)
			require.Regexp(t, fmt.Sprintf(`^sluice\s+down\s+%d `, newest), stdout)
		})
	}
}
