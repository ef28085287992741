-- The durable scheduler's source of truth: one row per schedule. Rows come
-- from migrations (the defaults of the built-in maintenance kinds, inserted by
-- the migration of each kind), from `sluice schedule add`, or from plain SQL.

-- +goose Up
CREATE TABLE schedules (
    id            bigserial PRIMARY KEY,
    name          text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    cron          text NOT NULL,
    timezone      text NOT NULL DEFAULT 'UTC',
    kind          text NOT NULL,
    args          jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(args) = 'object'),
    -- NULL: the kind's own queue.
    queue         text,
    enabled       boolean NOT NULL DEFAULT true,
    status        text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'failed')),
    misfire       text NOT NULL DEFAULT 'run_once' CHECK (misfire IN ('run_once', 'skip', 'run_all')),
    -- NULL: not computed yet; the dispatcher computes it from cron and
    -- timezone the first time it sees the row (so SQL and migrations can
    -- insert rows without evaluating cron).
    next_run_at   timestamptz,
    last_run_at   timestamptz,
    last_job_id   bigint,
    run_count     bigint NOT NULL DEFAULT 0,
    failure_count integer NOT NULL DEFAULT 0,
    max_retries   integer NOT NULL DEFAULT 5 CHECK (max_retries >= 0),
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE schedules IS
    'Durable schedules: the dispatcher of every sluice worker inserts one River job per due time. next_run_at NULL means "compute from cron".';

-- +goose Down
DROP TABLE schedules;
