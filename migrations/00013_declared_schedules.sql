-- Schedules declared in Go (sluice.Config.Schedules), and the insert
-- options of every schedule's jobs.
--
-- A worker writes its program's declared schedules at start, in one
-- transaction: schedule_declarations holds them as declared, and each is a
-- row of schedules with source 'config'. Any other change of a row's
-- definition (the CLI, a migration, any SQL) makes its source 'sql': the
-- operator's change wins over the declaration from then on, across
-- restarts, until `sluice schedule reset NAME` writes the declared
-- definition back (source 'config' again). A schedule the program no
-- longer declares is removed at the next start if its source is still
-- 'config'; one an operator changed stays, as an ordinary schedule.

-- +goose Up
ALTER TABLE schedules
    -- The River priority, max attempts and tags of the jobs inserted; NULL:
    -- the kind's own (River's defaults).
    ADD COLUMN priority     smallint CHECK (priority BETWEEN 1 AND 4),
    ADD COLUMN max_attempts integer CHECK (max_attempts BETWEEN 1 AND 10000),
    ADD COLUMN tags         text[],
    -- Who last wrote the definition: 'sql' (the CLI, a migration, any SQL)
    -- or 'config' (declared in Go, written by a worker at start).
    ADD COLUMN source       text NOT NULL DEFAULT 'sql' CHECK (source IN ('sql', 'config'));

-- A change of a row's definition takes the source of the transaction's
-- sluice.schedule_source setting: 'config' when a worker writes the
-- declared schedules (or `schedule reset` restores one), else 'sql'. The
-- dispatcher's bookkeeping (next_run_at, last_run_at, status, counts)
-- changes no source.
-- +goose StatementBegin
CREATE FUNCTION sluice_schedules_source() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR (NEW.cron, NEW.timezone, NEW.kind, NEW.args, NEW.queue, NEW.enabled, NEW.misfire,
           NEW.max_retries, NEW.priority, NEW.max_attempts, NEW.tags)
          IS DISTINCT FROM
          (OLD.cron, OLD.timezone, OLD.kind, OLD.args, OLD.queue, OLD.enabled, OLD.misfire,
           OLD.max_retries, OLD.priority, OLD.max_attempts, OLD.tags) THEN
        NEW.source := COALESCE(NULLIF(current_setting('sluice.schedule_source', true), ''), 'sql');
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER schedules_source BEFORE INSERT OR UPDATE ON schedules
    FOR EACH ROW EXECUTE FUNCTION sluice_schedules_source();

-- The schedules declared in Go, as the last worker that started declared
-- them (`sluice schedule reset NAME` restores a row from here).
CREATE TABLE schedule_declarations (
    name         text PRIMARY KEY,
    cron         text NOT NULL,
    timezone     text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL CHECK (jsonb_typeof(args) = 'object'),
    queue        text,
    priority     smallint,
    max_attempts integer,
    tags         text[],
    misfire      text NOT NULL,
    enabled      boolean NOT NULL,
    declared_by  text,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE schedule_declarations IS
    'Schedules declared in Go (sluice.Config.Schedules), written by every worker at start; schedules rows with source config follow them.';

-- +goose Down
DROP TABLE schedule_declarations;
DROP TRIGGER schedules_source ON schedules;
DROP FUNCTION sluice_schedules_source();
ALTER TABLE schedules DROP COLUMN source, DROP COLUMN tags, DROP COLUMN max_attempts, DROP COLUMN priority;
