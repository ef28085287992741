package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestPgScriptCreatesDatabase: `make run`'s scripts/pg.sh creates the
// database DATABASE_URL names when the server answers but the database
// does not exist yet, in both forms of connection string, and leaves an
// existing one alone.
func TestPgScriptCreatesDatabase(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skip("psql is not installed: pg.sh cannot create databases")
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "scripts", "pg.sh")
	ctx := context.Background()
	admin, err := pgkit.Open(ctx, testdb.ServerURL(), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	for _, form := range []string{"url", "kv"} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			var b [6]byte
			_, _ = rand.Read(b[:])
			name := testdb.TestPrefix + "pgsh_" + form + "_" + hex.EncodeToString(b[:])
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize())
			t.Cleanup(func() {
				_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			})
			url := testdb.WithDatabase(testdb.ServerURL(), name)
			if form == "kv" {
				cfg, err := pgkit.ParseConfig(testdb.ServerURL())
				require.NoError(t, err)
				url = "host=" + cfg.ConnConfig.Host + " port=" + strconv.Itoa(int(cfg.ConnConfig.Port)) + " user=" + cfg.ConnConfig.User + " dbname=" + name + " sslmode=disable"
			}
			for range 2 { // the second run finds it there
				cmd := exec.Command(script, "with-database", "ignored", "sh", "-c", `psql "$DATABASE_URL" -tAc "SELECT current_database()"`)
				cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, string(out))
				require.Contains(t, string(out), name)
			}
		})
	}
}
