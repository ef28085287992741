-- Enqueue policies: what an insert into river_job does when its key
-- already has max_waiting jobs waiting (available, scheduled, retryable or
-- pending; running never counts). One policy per kind, keyed by args
-- fields as limits are (sluice_partition_key); on conflict:
--   discard   the new job is not inserted; River's client gets the waiting
--             job back as its own duplicate answer
--   replace   the newest waiting job takes the new args and scheduled_at
--             (same id, attempts, place in any line)
--   debounce  replace, and scheduled_at moves to now + debounce, never past
--             first-waiting + max_delay
--   reject    the insert fails with SQLSTATE SLR01
--
-- A BEFORE INSERT trigger on river_job enforces it for every insert path.
-- Each waiting job of a policy's kind carries a unique key of sluice's own
-- ('slp' || md5(kind, key) || its id, unique states available, scheduled,
-- retryable, pending), so that River's unique index finds a key's waiting
-- jobs, in id order, with no index of sluice's on River's table; and so
-- that River's insert (INSERT ... ON CONFLICT (unique_key) DO UPDATE ...
-- RETURNING) answers with the waiting job's row when the trigger hands the
-- new row that job's key. Every key is distinct, so River's scheduler never
-- discards one job for another's key.

-- +goose Up
CREATE TABLE enqueue_policies (
    kind        text PRIMARY KEY CHECK (char_length(kind) BETWEEN 1 AND 127),
    -- top-level args fields keying the waiting jobs (NULL: one key per kind)
    by_args     text[] CHECK (by_args IS NULL OR (cardinality(by_args) BETWEEN 1 AND 8
                                                  AND array_position(by_args, NULL) IS NULL)),
    max_waiting integer NOT NULL CHECK (max_waiting BETWEEN 1 AND 1000000),
    on_conflict text NOT NULL CHECK (on_conflict IN ('discard', 'replace', 'debounce', 'reject')),
    debounce    interval,
    max_delay   interval,
    -- with replace: the waiting job keeps its own scheduled_at (and state)
    keep_scheduled_at boolean NOT NULL DEFAULT false,
    -- false: cleared by an operator while declared in Go (no policy)
    enabled     boolean NOT NULL DEFAULT true,
    -- who last wrote the definition: 'sql' (the CLI, any SQL) or 'config'
    source      text NOT NULL DEFAULT 'sql' CHECK (source IN ('sql', 'config')),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT enqueue_policies_debounce_check CHECK (
        (on_conflict = 'debounce') = (debounce IS NOT NULL)
        AND (debounce IS NULL) = (max_delay IS NULL)
        AND (debounce IS NULL OR (debounce > '0'::interval AND max_delay >= debounce))),
    CONSTRAINT enqueue_policies_keep_check CHECK (NOT keep_scheduled_at OR on_conflict = 'replace')
);

COMMENT ON TABLE enqueue_policies IS
    'Enqueue policies per job kind: at most max_waiting waiting jobs per key (by_args), and what a conflicting insert does (discard, replace, debounce, reject). Enforced by the trigger sluice_enqueue_policy on river_job.';

-- The policies declared in Go (sluice.Config.Policies), as the last worker
-- that started declared them (`sluice policy reset KIND` restores one).
CREATE TABLE enqueue_policy_declarations (
    kind        text PRIMARY KEY,
    by_args     text[],
    max_waiting integer NOT NULL,
    on_conflict text NOT NULL,
    debounce    interval,
    max_delay   interval,
    keep_scheduled_at boolean NOT NULL DEFAULT false,
    declared_by text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The outcomes of the inserts committed, per kind and key. Rejected
-- inserts are not counted here: their error rolls the count back with
-- the insert. Each insert of a key holds the key's row locked until it
-- commits: the inserts of one key go one at a time.
CREATE TABLE enqueue_policy_counts (
    kind       text NOT NULL,
    key        text NOT NULL,
    inserted   bigint NOT NULL DEFAULT 0,
    discarded  bigint NOT NULL DEFAULT 0,
    replaced   bigint NOT NULL DEFAULT 0,
    debounced  bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, key)
);

-- A change of a policy's definition takes the source of the transaction's
-- sluice.policy_source setting ('config' when a worker writes the declared
-- policies or `policy reset` restores one), else 'sql'.
-- +goose StatementBegin
CREATE FUNCTION sluice_enqueue_policies_source() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR (NEW.by_args, NEW.max_waiting, NEW.on_conflict, NEW.debounce, NEW.max_delay, NEW.keep_scheduled_at, NEW.enabled)
          IS DISTINCT FROM
          (OLD.by_args, OLD.max_waiting, OLD.on_conflict, OLD.debounce, OLD.max_delay, OLD.keep_scheduled_at, OLD.enabled) THEN
        NEW.source := COALESCE(NULLIF(current_setting('sluice.policy_source', true), ''), 'sql');
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER enqueue_policies_source BEFORE INSERT OR UPDATE ON enqueue_policies
    FOR EACH ROW EXECUTE FUNCTION sluice_enqueue_policies_source();

-- The first 19 bytes of the unique key of every waiting job of kind's key.
-- +goose StatementBegin
CREATE FUNCTION sluice_enqueue_policy_prefix(kind text, key text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT AS $$
SELECT '\x736c70'::bytea || decode(md5(kind || chr(10) || key), 'hex')
$$;
-- +goose StatementEnd

-- How many jobs of kind's key wait (River's unique index, by prefix: the
-- prefix names the kind; a filter on river_job.kind would make the planner
-- pick River's index on kind, a scan of every job of the kind).
-- +goose StatementBegin
CREATE FUNCTION sluice_enqueue_policy_waiting(kind text, key text) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path FROM CURRENT AS $$
SELECT count(*)::integer FROM river_job j
WHERE j.unique_key BETWEEN sluice_enqueue_policy_prefix($1, $2) || '\x0000000000000000'::bytea
                       AND sluice_enqueue_policy_prefix($1, $2) || '\xffffffffffffffff'::bytea
  AND j.unique_states IS NOT NULL
  AND river_job_state_in_bitmask(j.unique_states, j.state)
$$;
-- +goose StatementEnd

-- The policy's decision for a new row of river_job. See the file's head.
-- A conflicting row of River's insert (its statement ends in ON CONFLICT
-- (unique_key) ... DO UPDATE) is handed the waiting job's unique key: River
-- answers with that job's row, unique_skipped_as_duplicate true; a replace
-- is applied to the waiting job by the BEFORE UPDATE trigger of that DO
-- UPDATE (sluice_enqueue_policy_apply, from sluice.policy_apply). Any other
-- insert (plain SQL, COPY, River's InsertManyFast) is skipped (INSERT 0 0)
-- and a replace applied here.
-- +goose StatementBegin
CREATE FUNCTION sluice_enqueue_policy() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    p        enqueue_policies%ROWTYPE;
    k        text;
    prefix   bytea;
    n        integer;
    w        record;
    outcome  text;
    mark     text;
    first_id bigint;
    cid      bigint;
    stmt     text;
    river    boolean;
    newargs  jsonb;
    first_at timestamptz;
    due      timestamptz;
    newstate river_job_state;
    lim      record;
    attempt  integer;
BEGIN
    SELECT * INTO p FROM enqueue_policies e WHERE e.kind = NEW.kind AND e.enabled;
    IF NOT FOUND
       OR NEW.unique_key IS NOT NULL  -- River's unique jobs follow River's uniqueness
       OR NEW.state NOT IN ('available', 'scheduled', 'retryable', 'pending') THEN
        RETURN NEW;
    END IF;
    -- The key (sluice_partition_key) and the prefix of its unique keys
    -- (sluice_enqueue_policy_prefix), computed here: a call of a SQL
    -- function with a pinned search_path costs more than the rest.
    k := CASE
        WHEN p.by_args IS NULL THEN ''
        WHEN cardinality(p.by_args) = 1 THEN COALESCE(NEW.args -> p.by_args[1], 'null'::jsonb)::text
        ELSE (SELECT jsonb_agg(COALESCE(NEW.args -> u.f, 'null'::jsonb) ORDER BY u.i)
              FROM unnest(p.by_args) WITH ORDINALITY AS u(f, i))::text
    END;
    prefix := '\x736c70'::bytea || decode(md5(NEW.kind || chr(10) || k), 'hex');

    -- Per statement, in sluice.policy_stmt ("statement|river|first row"):
    -- whether it is River's insert (ON CONFLICT (unique_key) ... DO
    -- UPDATE), and the first row it inserted or answered with, whose cmin
    -- is the statement's command id (ON CONFLICT DO UPDATE may not touch a
    -- row the statement inserted or answered with).
    stmt := extract(epoch FROM statement_timestamp())::text || '/' || txid_current()::text;
    mark := current_setting('sluice.policy_stmt', true);
    IF mark IS NOT NULL AND split_part(mark, '|', 1) = stmt THEN
        river := split_part(mark, '|', 2) = 't';
        first_id := NULLIF(split_part(mark, '|', 3), '')::bigint;
    ELSE
        river := current_query() ~* 'on\s+conflict\s*\(\s*unique_key\s*\)[^;]*do\s+update';
    END IF;

    -- One insert at a time per key, until commit, so that the count below
    -- is true: the key's row of enqueue_policy_counts is locked first (a
    -- row lock: an InsertMany of many keys takes no slot of the shared
    -- lock table per key, as advisory locks would), then the waiting job
    -- that answers, always in that order.
    LOOP
        PERFORM 1 FROM enqueue_policy_counts c WHERE c.kind = NEW.kind AND c.key = k FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO enqueue_policy_counts (kind, key) VALUES (NEW.kind, k) ON CONFLICT DO NOTHING;
    END LOOP;

    -- Decide; again when the waiting job picked was fetched while this
    -- insert waited for its lock (it runs: it no longer waits).
    FOR attempt IN 1..100 LOOP
        -- (the query of sluice_enqueue_policy_waiting, planned once here)
        SELECT count(*)::integer INTO n FROM river_job j
        WHERE j.unique_key BETWEEN prefix || '\x0000000000000000'::bytea AND prefix || '\xffffffffffffffff'::bytea
          AND j.unique_states IS NOT NULL
          AND river_job_state_in_bitmask(j.unique_states, j.state);
        IF n < p.max_waiting THEN
            NEW.unique_key := prefix || int8send(NEW.id);
            NEW.unique_states := B'10110001';  -- available, pending, retryable, scheduled
            NEW.metadata := NEW.metadata || jsonb_build_object('sluice_policy',
                jsonb_build_object('key', k, 'first_waiting_at', now()));
            IF p.on_conflict = 'debounce' AND NEW.state IN ('available', 'scheduled') THEN
                -- Due after the quiet period. It stays available: River
                -- fetches an available job only once scheduled_at has
                -- passed, at its next fetch poll, without waiting for the
                -- scheduler's promotion.
                NEW.scheduled_at := LEAST(GREATEST(NEW.scheduled_at, now() + p.debounce), now() + p.max_delay);
                NEW.state := 'available';
            END IF;
            IF mark IS NULL OR split_part(mark, '|', 1) <> stmt THEN
                PERFORM set_config('sluice.policy_stmt', stmt || '|' || river::text::char || '|' || NEW.id::text, true);
            END IF;
            UPDATE enqueue_policy_counts c SET inserted = c.inserted + 1, updated_at = now()
            WHERE c.kind = NEW.kind AND c.key = k;
            RETURN NEW;
        END IF;

        IF p.on_conflict = 'reject' THEN
            RAISE EXCEPTION USING ERRCODE = 'SLR01',
                MESSAGE = format('enqueue policy of %s: key %s already has %s waiting jobs (max_waiting %s): insert rejected',
                                 NEW.kind, CASE WHEN p.by_args IS NULL THEN '(the kind)' ELSE k END, n, p.max_waiting),
                HINT = 'sluice policy keys ' || NEW.kind || ' lists the keys; the error aborts the statement (and the transaction, unless a savepoint catches it)';
        END IF;

        IF river AND first_id IS NOT NULL AND cid IS NULL THEN
            SELECT j.cmin::text::bigint INTO cid FROM river_job j WHERE j.id = first_id;
        END IF;
        -- The waiting job that answers: the newest one, locked so that no
        -- worker fetches it until commit; for River's insert, one this
        -- statement has not inserted or answered with (ON CONFLICT DO
        -- UPDATE touches a row once per statement).
        SELECT j.id, j.args, j.state, j.scheduled_at, j.unique_key, j.unique_states, j.metadata INTO w
        FROM river_job j
        WHERE j.unique_key BETWEEN prefix || '\x0000000000000000'::bytea AND prefix || '\xffffffffffffffff'::bytea
          AND j.unique_states IS NOT NULL
          AND river_job_state_in_bitmask(j.unique_states, j.state)
          AND NOT (cid IS NOT NULL AND j.xmin = pg_current_xact_id()::xid AND j.cmin::text::bigint >= cid)
        ORDER BY j.unique_key DESC
        LIMIT 1
        FOR UPDATE;
        IF FOUND THEN
            EXIT;
        END IF;
        IF cid IS NOT NULL AND EXISTS (
            SELECT 1 FROM river_job j
            WHERE j.unique_key BETWEEN prefix || '\x0000000000000000'::bytea AND prefix || '\xffffffffffffffff'::bytea
              AND j.unique_states IS NOT NULL
              AND river_job_state_in_bitmask(j.unique_states, j.state)
              AND j.xmin = pg_current_xact_id()::xid AND j.cmin::text::bigint >= cid) THEN
            RAISE EXCEPTION USING ERRCODE = 'SLR02',
                MESSAGE = format('enqueue policy of %s: key %s: one InsertMany carries more jobs of the key than there are waiting jobs to %s (max_waiting %s); River''s ON CONFLICT answer can name a row once per statement',
                                 NEW.kind, k, p.on_conflict, p.max_waiting),
                HINT = 'insert one job per key per InsertMany (River itself fails on two jobs of one unique key in one InsertMany)';
        END IF;
    END LOOP;
    IF w.id IS NULL THEN
        RAISE EXCEPTION 'enqueue policy of %: key %: the waiting jobs kept changing state; insert again', NEW.kind, k;
    END IF;
    outcome := CASE p.on_conflict WHEN 'discard' THEN 'discarded' WHEN 'replace' THEN 'replaced' ELSE 'debounced' END;

    IF mark IS NULL OR split_part(mark, '|', 1) <> stmt THEN
        PERFORM set_config('sluice.policy_stmt', stmt || '|' || river::text::char || '|' || w.id::text, true);
    END IF;

    IF outcome <> 'discarded' THEN
        newargs := NEW.args;
        -- A waiting job in a limit's line keeps its key there.
        IF NEW.args IS DISTINCT FROM w.args THEN
            SELECT l.partition_fields INTO lim FROM concurrency_limits l
            WHERE l.kind = NEW.kind AND l.partition_fields IS NOT NULL;
            IF FOUND AND sluice_partition_key(NEW.args, lim.partition_fields) IS DISTINCT FROM sluice_partition_key(w.args, lim.partition_fields)
               AND (w.state = 'pending'
                    OR EXISTS (SELECT 1 FROM concurrency_parked_jobs pj WHERE pj.job_id = w.id)
                    OR EXISTS (SELECT 1 FROM concurrency_executions ce WHERE ce.job_id = w.id)) THEN
                RAISE EXCEPTION USING ERRCODE = 'SLR02',
                    MESSAGE = format('enqueue policy of %s: replace of waiting job %s refused: the new args change its limit key (by %s) from %s to %s while it waits in that key''s line',
                                     NEW.kind, w.id, array_to_string(lim.partition_fields, ','),
                                     sluice_partition_key(w.args, lim.partition_fields), sluice_partition_key(NEW.args, lim.partition_fields)),
                    HINT = 'insert with the same limit key, or cancel the waiting job first';
            END IF;
        END IF;
        first_at := COALESCE((w.metadata->'sluice_policy'->>'first_waiting_at')::timestamptz, now());
        IF outcome = 'debounced' THEN
            -- available: River fetches it once due (see above)
            due := LEAST(GREATEST(NEW.scheduled_at, now() + p.debounce), first_at + p.max_delay);
            newstate := 'available';
        ELSIF p.keep_scheduled_at THEN
            due := w.scheduled_at;
            newstate := CASE WHEN w.state = 'scheduled' THEN 'scheduled' ELSE 'available' END;
        ELSE
            due := NEW.scheduled_at;
            newstate := CASE WHEN NEW.state = 'scheduled' THEN 'scheduled' ELSE 'available' END;
        END IF;
        IF river THEN
            PERFORM set_config('sluice.policy_apply', jsonb_build_object(
                'id', w.id, 'args', newargs, 'scheduled_at', due, 'outcome', outcome,
                'state', newstate)::text, true);
        ELSE
            UPDATE river_job j
            SET args = newargs,
                scheduled_at = CASE WHEN j.state = 'pending' THEN j.scheduled_at ELSE due END,
                state = CASE WHEN j.state IN ('available', 'scheduled') THEN newstate ELSE j.state END,
                metadata = jsonb_set(j.metadata, '{sluice_policy}', COALESCE(j.metadata->'sluice_policy', '{}'::jsonb)
                    || jsonb_build_object('replaces', COALESCE((j.metadata->'sluice_policy'->>'replaces')::integer, 0) + 1,
                                          'replaced_at', now(), 'last_outcome', outcome))
            WHERE j.id = w.id;
        END IF;
    END IF;
    UPDATE enqueue_policy_counts c
    SET discarded = c.discarded + (outcome = 'discarded')::int, replaced = c.replaced + (outcome = 'replaced')::int,
        debounced = c.debounced + (outcome = 'debounced')::int, updated_at = now()
    WHERE c.kind = NEW.kind AND c.key = k;
    IF river THEN
        NEW.unique_key := w.unique_key;
        NEW.unique_states := w.unique_states;
        RETURN NEW;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Named so that it fires before River's and sluice's other triggers would
-- see the row; every row of a kind without a policy pays one index lookup.
CREATE TRIGGER sluice_enqueue_policy
    BEFORE INSERT ON river_job
    FOR EACH ROW EXECUTE FUNCTION sluice_enqueue_policy();

-- A replace decided by sluice_enqueue_policy for River's insert, applied to
-- the waiting job by the insert's own ON CONFLICT DO UPDATE. Every other
-- update of river_job stops at the WHEN clause.
-- +goose StatementBegin
CREATE FUNCTION sluice_enqueue_policy_apply() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    a   jsonb := current_setting('sluice.policy_apply')::jsonb;
    due timestamptz;
BEGIN
    IF (a->>'id')::bigint <> OLD.id THEN
        RETURN NEW;
    END IF;
    PERFORM set_config('sluice.policy_apply', '', true);
    due := (a->>'scheduled_at')::timestamptz;
    NEW.args := a->'args';
    IF OLD.state <> 'pending' THEN
        NEW.scheduled_at := due;
    END IF;
    IF OLD.state IN ('available', 'scheduled') THEN
        NEW.state := (a->>'state')::river_job_state;
    END IF;
    NEW.metadata := jsonb_set(NEW.metadata, '{sluice_policy}', COALESCE(NEW.metadata->'sluice_policy', '{}'::jsonb)
        || jsonb_build_object('replaces', COALESCE((NEW.metadata->'sluice_policy'->>'replaces')::integer, 0) + 1,
                              'replaced_at', now(), 'last_outcome', a->>'outcome'));
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER sluice_enqueue_policy_apply
    BEFORE UPDATE ON river_job
    FOR EACH ROW
    WHEN (COALESCE(current_setting('sluice.policy_apply', true), '') <> '')
    EXECUTE FUNCTION sluice_enqueue_policy_apply();

-- Per kind and key: the jobs waiting, the cap, and the outcomes counted.
CREATE VIEW enqueue_policy_keys AS
SELECT c.kind, c.key, sluice_enqueue_policy_waiting(c.kind, c.key) AS waiting,
       p.max_waiting, p.on_conflict, p.by_args,
       c.inserted, c.discarded, c.replaced, c.debounced, c.updated_at AS last_enqueue_at
FROM enqueue_policy_counts c
LEFT JOIN enqueue_policies p ON p.kind = c.kind AND p.enabled;

-- Per kind and outcome: the inserts counted (rejected ones are not: their
-- error rolls their count back).
CREATE VIEW enqueue_policy_outcomes AS
SELECT kind, 'inserted'::text AS outcome, sum(inserted)::bigint AS count FROM enqueue_policy_counts GROUP BY kind
UNION ALL
SELECT kind, 'discarded'::text, sum(discarded)::bigint FROM enqueue_policy_counts GROUP BY kind
UNION ALL
SELECT kind, 'replaced'::text, sum(replaced)::bigint FROM enqueue_policy_counts GROUP BY kind
UNION ALL
SELECT kind, 'debounced'::text, sum(debounced)::bigint FROM enqueue_policy_counts GROUP BY kind;

-- +goose Down
DROP VIEW enqueue_policy_outcomes;
DROP VIEW enqueue_policy_keys;
DROP TRIGGER sluice_enqueue_policy_apply ON river_job;
DROP FUNCTION sluice_enqueue_policy_apply();
DROP TRIGGER sluice_enqueue_policy ON river_job;
DROP FUNCTION sluice_enqueue_policy();
DROP FUNCTION sluice_enqueue_policy_waiting(text, text);
DROP FUNCTION sluice_enqueue_policy_prefix(text, text);
-- The waiting jobs keep no key of sluice's: River's uniqueness never
-- applied to them.
UPDATE river_job SET unique_key = NULL, unique_states = NULL
WHERE substring(unique_key FROM 1 FOR 3) = '\x736c70'::bytea AND octet_length(unique_key) = 27;
DROP TRIGGER enqueue_policies_source ON enqueue_policies;
DROP FUNCTION sluice_enqueue_policies_source();
DROP TABLE enqueue_policy_counts;
DROP TABLE enqueue_policy_declarations;
DROP TABLE enqueue_policies;
