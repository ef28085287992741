-- The greeter's own table, and a schedule for its own kind.
--
-- An application's migrations (sluice.Config.Migrations) run after River's,
-- sluice's and the modules', with the connection's own search_path: the
-- greetings table lands in the database's usual schema (public), next to
-- River's tables, not in sluice's. sluice's tables are in the schema sluice,
-- so the schedule is written to sluice.schedules by its qualified name.
--
-- The schedule is declared idempotently: run again (or changed by a later
-- migration the same way), the row ends up as written here. The dispatcher
-- of every worker computes next_run_at from cron (left NULL here) and
-- inserts one greeter.greet job per due time.

-- +goose Up
CREATE TABLE greetings (
    id         bigserial PRIMARY KEY,
    name       text NOT NULL,
    greeted_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO sluice.schedules (name, cron, kind, args)
VALUES ('greeter.every_second', '@every 1s', 'greeter.greet', '{"name": "cron"}')
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron, kind = EXCLUDED.kind, args = EXCLUDED.args;

-- +goose Down
DELETE FROM sluice.schedules WHERE name = 'greeter.every_second';
DROP TABLE greetings;
