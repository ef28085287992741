package torture

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// recordSQL creates the database's part of the test's record:
// torture_states (every state change of a torture job, by trigger) and
// torture_limits (every change of a torture kind's limits, by trigger), in
// public, beside nothing of sluice's. The executions are in the workers'
// run logs (runLog).
const recordSQL = `
CREATE TABLE public.torture_states (
    id           bigserial PRIMARY KEY,
    job_id       bigint NOT NULL,
    kind         text NOT NULL,
    old_state    text,
    new_state    text NOT NULL,
    scheduled_at timestamptz,
    client       text,
    attempt      integer,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The statement that resumed a parked job (for diagnosis).
    query        text,
    -- Its transaction: a resume in a change's own transaction follows the
    -- change's limits; one in another, those committed before it.
    tx           bigint NOT NULL DEFAULT txid_current()
);

-- Every change of a torture job's parking mark (metadata sluice_park:
-- true, "granted", "ahead"), with its statement: for diagnosis only.
CREATE TABLE public.torture_marks (
    id        bigserial PRIMARY KEY,
    job_id    bigint NOT NULL,
    old_mark  text,
    new_mark  text,
    old_state text,
    new_state text,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    query     text,
    tx        bigint NOT NULL DEFAULT txid_current()
);

CREATE FUNCTION public.torture_log_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.kind LIKE 'torture.%' THEN
            INSERT INTO public.torture_states (job_id, kind, old_state, new_state, attempt)
            VALUES (OLD.id, OLD.kind, OLD.state::text, 'deleted', OLD.attempt);
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.kind NOT LIKE 'torture.%' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.torture_states (job_id, kind, new_state, scheduled_at, attempt)
        VALUES (NEW.id, NEW.kind, NEW.state::text, NEW.scheduled_at, NEW.attempt);
    ELSIF NEW.state IS DISTINCT FROM OLD.state OR NEW.scheduled_at IS DISTINCT FROM OLD.scheduled_at THEN
        INSERT INTO public.torture_states (job_id, kind, old_state, new_state, scheduled_at, client, attempt, query)
        VALUES (NEW.id, NEW.kind, OLD.state::text, NEW.state::text, NEW.scheduled_at,
                NEW.attempted_by[array_length(NEW.attempted_by, 1)], NEW.attempt,
                CASE WHEN OLD.state = 'pending' THEN left(regexp_replace(current_query(), '\s+', ' ', 'g'), 60) END);
    END IF;
    IF TG_OP = 'UPDATE' AND (NEW.metadata->>'sluice_park') IS DISTINCT FROM (OLD.metadata->>'sluice_park') THEN
        INSERT INTO public.torture_marks (job_id, old_mark, new_mark, old_state, new_state, query)
        VALUES (NEW.id, OLD.metadata->>'sluice_park', NEW.metadata->>'sluice_park', OLD.state::text, NEW.state::text,
                left(regexp_replace(current_query(), '\s+', ' ', 'g'), 60));
    END IF;
    RETURN NULL;
END $$;
-- Named to fire first of river_job's AFTER triggers (they fire in name
-- order): sluice_step_back updates the row again from inside its own
-- AFTER trigger (running → pending → available in one statement), and the
-- record must hold the outer change before the nested one.
CREATE TRIGGER a_torture_log_state AFTER INSERT OR UPDATE OR DELETE ON river_job
    FOR EACH ROW EXECUTE FUNCTION public.torture_log_state();

-- When each fetch's transaction committed (other workers see its jobs,
-- the limiter's fetch marks among them, from then on): logged by a
-- trigger deferred to the commit, once per transaction, for diagnosis.
CREATE TABLE public.torture_commits (
    tx bigint PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION public.torture_log_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.torture_commits (tx) VALUES (NEW.tx) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER torture_log_commit AFTER INSERT ON public.torture_states
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.new_state = 'running') EXECUTE FUNCTION public.torture_log_commit();

CREATE TABLE public.torture_limits (
    id               bigserial PRIMARY KEY,
    kind             text NOT NULL,
    present          boolean NOT NULL,
    max_concurrency  integer,
    partition_fields text[],
    key_max          integer,
    rate_max         integer,
    rate_period_ms   bigint,
    rate_per_key     boolean,
    at               timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- When the change's transaction began: it acts on the new limits (a
    -- clear lets its line go, a raise grants) before its commit.
    began            timestamptz NOT NULL DEFAULT now(),
    -- The change's transaction: a resume in it follows the new limits.
    tx               bigint NOT NULL DEFAULT txid_current()
);

CREATE FUNCTION public.torture_log_limit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.kind LIKE 'torture.%' THEN
            INSERT INTO public.torture_limits (kind, present) VALUES (OLD.kind, false);
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.kind LIKE 'torture.%' THEN
        INSERT INTO public.torture_limits (kind, present, max_concurrency, partition_fields, key_max, rate_max,
                                           rate_period_ms, rate_per_key)
        VALUES (NEW.kind, true, NEW.max_concurrency, NEW.partition_fields, NEW.key_max, NEW.rate_max,
                (extract(epoch FROM NEW.rate_period) * 1000)::bigint, NEW.rate_per_key);
    END IF;
    RETURN NULL;
END $$;
-- Deferred to the commit of the change's transaction: its time is when
-- the change took effect (the transaction holds the kind's limit row until
-- then, so no decision before it saw the new limits).
CREATE CONSTRAINT TRIGGER torture_log_limit
    AFTER INSERT OR DELETE OR UPDATE OF max_concurrency, partition_fields, key_max, rate_max, rate_period, rate_per_key
    ON concurrency_limits
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION public.torture_log_limit();

-- Every change of a torture job's slot rows and waiter rows, and every
-- parking record written, with the statement that made it (the moment a
-- job is decided to park, before River's completion makes it pending; and
-- for diagnosis of what the books find left).
CREATE TABLE public.torture_line (
    id       bigserial PRIMARY KEY,
    job_id   bigint NOT NULL,
    what     text NOT NULL,
    reserved boolean,
    worker   text,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    query    text,
    tx       bigint NOT NULL DEFAULT txid_current()
);
CREATE FUNCTION public.torture_log_line() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF r.kind LIKE 'torture.%' THEN
        INSERT INTO public.torture_line (job_id, what, reserved, worker, query)
        VALUES (r.job_id, TG_TABLE_NAME || ' ' || TG_OP,
                (to_jsonb(r)->>'reserved')::boolean, to_jsonb(r)->>'worker_id',
                left(regexp_replace(current_query(), '\s+', ' ', 'g'), 60));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER torture_log_line AFTER INSERT OR UPDATE OR DELETE ON concurrency_executions
    FOR EACH ROW EXECUTE FUNCTION public.torture_log_line();
CREATE TRIGGER torture_log_line AFTER INSERT OR UPDATE OR DELETE ON concurrency_waiters
    FOR EACH ROW EXECUTE FUNCTION public.torture_log_line();
CREATE TRIGGER torture_log_line AFTER INSERT ON concurrency_parked_jobs
    FOR EACH ROW EXECUTE FUNCTION public.torture_log_line();
CREATE TRIGGER torture_log_line AFTER INSERT OR UPDATE OR DELETE ON concurrency_starts
    FOR EACH ROW EXECUTE FUNCTION public.torture_log_line();

-- The torture workers know only the torture kinds: sluice's own schedules
-- of the modules' kinds stay off; the limiter's safety net stays on.
UPDATE schedules SET enabled = false WHERE kind <> 'concurrency_limit.resume';
`

// workerProc is one torture worker process.
type workerProc struct {
	id        string
	parkAfter time.Duration
	cmd       *exec.Cmd
	done      chan struct{}
	mu        sync.Mutex
	log       bytes.Buffer
}

// output is what the process wrote to stderr so far.
func (w *workerProc) output() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// workerPoolSize is the size of a torture worker's pool: four workers and
// the test stay well inside a default server's 100 connections while other
// test packages run beside them.
const workerPoolSize = 8

// withPoolSize returns url with its pool size set to n.
func withPoolSize(url string, n int) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "pool_max_conns=" + strconv.Itoa(n)
}

// runLogExt names a worker's run log in the seed's runs directory.
const runLogExt = ".runs"

// startWorker starts the test binary as a torture worker named id, logging
// its executions in runsDir, and waits until it works jobs.
func startWorker(t testing.TB, url, runsDir, id string, parkAfter time.Duration, slots int) *workerProc {
	t.Helper()
	w := &workerProc{id: id, parkAfter: parkAfter, done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run=^$")
	w.cmd.Env = append(os.Environ(), workerEnv+"="+id, "DATABASE_URL="+withPoolSize(url, workerPoolSize),
		workerRunsEnv+"="+filepath.Join(runsDir, id+runLogExt),
		workerParkEnv+"="+parkAfter.String(), workerSlotsEnv+"="+strconv.Itoa(slots))
	var stderr io.Writer = &w.log
	if dir := os.Getenv("TORTURE_WORKER_LOGS"); dir != "" {
		// Each worker's log in a file of its own too, for diagnosis, in a
		// directory per test (per seed, in a run of many).
		dir = filepath.Join(dir, strings.NewReplacer("/", "_", "=", "-").Replace(t.Name()))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("TORTURE_WORKER_LOGS: %v", err)
		}
		f, err := os.Create(filepath.Join(dir, id+".log"))
		if err != nil {
			t.Fatalf("TORTURE_WORKER_LOGS: %v", err)
		}
		t.Cleanup(func() { _ = f.Close() })
		stderr = io.MultiWriter(&w.log, f)
	}
	w.cmd.Stderr = lockedWriter{mu: &w.mu, w: stderr}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("start torture worker %s: %v", id, err)
	}
	started := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), workerStartedMsg) {
				once.Do(func() { close(started) })
			}
		}
	}()
	go func() {
		_ = w.cmd.Wait()
		close(w.done)
	}()
	select {
	case <-started:
	case <-w.done:
		t.Fatalf("torture worker %s exited at start:\n%s", id, w.output())
	case <-time.After(30 * time.Second):
		_ = w.cmd.Process.Kill()
		t.Fatalf("torture worker %s did not start:\n%s", id, w.output())
	}
	return w
}

// stop stops the worker gracefully (SIGTERM) and waits for it.
func (w *workerProc) stop(t testing.TB) {
	t.Helper()
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(20 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
		t.Errorf("torture worker %s did not stop within 20s:\n%s", w.id, w.output())
	}
}

// kill kills the worker (SIGKILL) and waits until it is gone.
func (w *workerProc) kill() {
	_ = w.cmd.Process.Kill()
	<-w.done
}

// dbNow is the database's clock.
func dbNow(ctx context.Context, pool *pgxpool.Pool) (time.Time, error) {
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return now, nil
}
