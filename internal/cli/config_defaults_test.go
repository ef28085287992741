package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules"
)

// TestMainConfigDefaults: a program's Config gives Main's flags their
// defaults (shown in --help), a flag still wins, and a worker started
// without flags serves the Config's queues.
func TestMainConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg := app.Config{Modules: modules.All(), ParkAfter: 3 * time.Second, JobTimeout: 2 * time.Minute,
		Queues: map[string]int{"default": 3, "mail": 2}, HTTPAddr: ""}
	var out, errOut bytes.Buffer
	require.Equal(t, 0, Run(context.Background(), cfg, []string{"worker", "--help"}, &out, &errOut), errOut.String())
	require.Regexp(t, `--park-after duration\s+.*\(default 3s\)`, out.String())
	require.Regexp(t, `--job-timeout duration\s+.*\(default 2m0s\)`, out.String())

	url := testdb.New(t)
	pool := livePool(t, url)
	run := func(id string, args ...string) map[string]int {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		var o, e bytes.Buffer
		go func() {
			done <- Run(ctx, cfg, append([]string{"worker", "--database-url", url, "--http-addr", "", "--id", id}, args...), &o, &e)
		}()
		var queues map[string]int
		require.Eventually(t, func() bool {
			var raw []byte
			if err := pool.QueryRow(ctx, `SELECT queues FROM sluice_workers WHERE id = $1`, id).Scan(&raw); err != nil {
				return false
			}
			return json.Unmarshal(raw, &queues) == nil
		}, 30*time.Second, 50*time.Millisecond)
		// Cancelled as soon as its row is there, perhaps still starting:
		// a stop asked for is a clean stop either way.
		cancel()
		require.Equal(t, 0, <-done, e.String())
		return queues
	}
	require.Equal(t, map[string]int{"default": 3, "mail": 2, "maintenance": 4}, run("config-queues"))
	require.Equal(t, map[string]int{"default": 7, "maintenance": 4}, run("flag-queues", "--default-workers", "7"))
}
