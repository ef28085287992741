package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// readme is the repository's README.md.
func readme(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "README.md"))
	require.NoError(t, err)
	return string(b)
}

// codeBlocks are the fenced blocks of language lang in doc, dedented (a
// block in a list item is indented), each with the heading it is under.
func codeBlocks(doc, lang string) (blocks, headings []string) {
	heading := ""
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "#") {
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
		trimmed := strings.TrimLeft(line, " ")
		if trimmed != "```"+lang {
			continue
		}
		indent := len(line) - len(trimmed)
		var body []string
		for i++; i < len(lines) && strings.TrimLeft(lines[i], " ") != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], strings.Repeat(" ", indent)))
		}
		blocks = append(blocks, strings.Join(body, "\n"))
		headings = append(headings, heading)
	}
	return blocks, headings
}

// gooseUp is the Up part of a goose migration block (the block itself when
// it is none).
func gooseUp(block string) string {
	up := strings.Index(block, "-- +goose Up")
	if up < 0 {
		return block
	}
	block = block[up+len("-- +goose Up"):]
	if down := strings.Index(block, "-- +goose Down"); down >= 0 {
		block = block[:down]
	}
	return block
}

// TestReadmeSQL: every SQL block of the README runs as written in a plain
// session on a migrated database (the default search_path, as `psql
// "$DATABASE_URL"` has it), each in a transaction rolled back after it; a
// migration block runs its Up part.
func TestReadmeSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	blocks, headings := codeBlocks(readme(t), "sql")
	require.GreaterOrEqual(t, len(blocks), 8, "the README's SQL blocks")
	conn, err := pgx.Connect(ctx, testdb.New(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var searchPath string
	require.NoError(t, conn.QueryRow(ctx, "SHOW search_path").Scan(&searchPath))
	require.NotContains(t, searchPath, "sluice", "a plain session: sluice's schema is not on its search_path")
	for i, block := range blocks {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Conn().PgConn().Exec(ctx, gooseUp(block)).ReadAll()
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, err, "SQL block %d (under %q) fails when pasted:\n%s", i+1, headings[i], block)
	}
}

// TestReadmeTour follows the README's five-minute tour, command by command,
// against a fresh database with a worker running (as `make run` leaves
// it), and checks what each says.
func TestReadmeTour(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql is not installed: the tour uses it (it comes with PostgreSQL's client)")
	}
	blocks, headings := codeBlocks(readme(t), "sh")
	var tour string
	for i, h := range headings {
		if h == "Five-minute tour" {
			tour = blocks[i]
			break
		}
	}
	require.NotEmpty(t, tour, "the README has a five-minute tour")
	var steps []string
	for _, line := range strings.Split(tour, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			steps = append(steps, line)
		}
	}
	require.True(t, strings.HasPrefix(steps[0], `export DATABASE_URL="$(scripts/pg.sh database-url sluice)"`),
		"the tour starts with the database make run uses: %s", steps[0])

	url := testdb.New(t)
	proc.StartWorker(t, url, "tour")
	binDir := filepath.Dir(proc.Binary(t))
	// Each step as a user pastes it, with bin/sluice the test's build and
	// DATABASE_URL the test's database in place of the first step.
	expect := []struct {
		step string         // how the step starts
		out  *regexp.Regexp // what it prints
	}{
		{`bin/sluice enqueue demo.sleep --args '{"ms": 2000}'`, regexp.MustCompile(`^\d+\n$`)},
		{`bin/sluice jobs list`, regexp.MustCompile(`(?m)^\d+\s+demo\.sleep\s+default\s`)},
		{`bin/sluice limits set demo.sleep 1`, regexp.MustCompile(`^demo\.sleep: 1\n$`)},
		{`for i in 1 2 3; do bin/sluice enqueue demo.sleep`, regexp.MustCompile(`^\d+\n\d+\n\d+\n$`)},
		{`sleep 3; bin/sluice parked list`, regexp.MustCompile(`(?m)^\d+\s+demo\.sleep\s.*concurrency limit`)},
		{`psql "$DATABASE_URL" -c 'SELECT job_id, kind, reason, parked_at FROM sluice.parked_jobs'`, regexp.MustCompile(`(?m)^\s*\d+ \| demo\.sleep \| (limit|fifo)\s+\|`)},
		{`bin/sluice jobs cancel`, regexp.MustCompile(`(?m)^job \d+ \(demo\.sleep\) cancelled`)},
		{`bin/sluice limits clear demo.sleep`, regexp.MustCompile(`demo\.sleep`)},
		{`bin/sluice health`, regexp.MustCompile(`(?m)^OK`)},
	}
	require.Len(t, steps, len(expect)+1, "the tour's steps:\n%s", strings.Join(steps, "\n"))
	for i, want := range expect {
		step := steps[i+1]
		require.True(t, strings.HasPrefix(step, want.step), "step %d is %q, want %q", i+2, step, want.step)
		cmd := exec.Command("bash", "-o", "pipefail", "-c", strings.ReplaceAll(step, "bin/sluice", filepath.Join(binDir, "sluice")))
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "PATH="+filepath.Dir(psql)+":"+os.Getenv("PATH"))
		cmd.Stderr = nil
		out, err := cmd.Output()
		var stderr string
		if exitErr, ok := err.(*exec.ExitError); ok {
			stderr = string(exitErr.Stderr)
		}
		require.NoError(t, err, "step %d: %s\n%s%s", i+2, step, out, stderr)
		require.Regexp(t, want.out, string(out), "step %d: %s", i+2, step)
	}
}
