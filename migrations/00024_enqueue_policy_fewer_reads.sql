-- The enqueue policy's trigger with fewer reads per row (P13): under a
-- cap of one waiting job per key (the common case: discard, replace or
-- debounce of one job), the waiting job that would answer is looked up
-- and locked first, and when there is one the key is full: no count of
-- the key's waiting jobs. The command id of a River statement's first row
-- (what ON CONFLICT DO UPDATE may not touch again) is read once per
-- statement, not once per row. Nothing else changes: the decisions, the
-- locks (the key's counts row, then the waiting job) and their order, the
-- answers and the counts are those of migration 00018.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_enqueue_policy() RETURNS trigger LANGUAGE plpgsql
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

    -- Per statement, in sluice.policy_stmt ("statement|river|first
    -- row|command id"): whether it is River's insert (ON CONFLICT
    -- (unique_key) ... DO UPDATE), the first row it inserted or answered
    -- with, and that row's cmin, the statement's command id (ON CONFLICT DO
    -- UPDATE may not touch a row the statement inserted or answered with),
    -- read once by the statement's second row.
    stmt := extract(epoch FROM statement_timestamp())::text || '/' || txid_current()::text;
    mark := current_setting('sluice.policy_stmt', true);
    IF mark IS NOT NULL AND split_part(mark, '|', 1) = stmt THEN
        river := split_part(mark, '|', 2) = 't';
        first_id := NULLIF(split_part(mark, '|', 3), '')::bigint;
        cid := NULLIF(split_part(mark, '|', 4), '')::bigint;
        IF river AND first_id IS NOT NULL AND cid IS NULL THEN
            SELECT j.cmin::text::bigint INTO cid FROM river_job j WHERE j.id = first_id;
            PERFORM set_config('sluice.policy_stmt', mark || '|' || cid::text, true);
        END IF;
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
        IF p.max_waiting = 1 AND p.on_conflict <> 'reject' THEN
            -- One waiting job fills the key: the one that would answer
            -- (below), found and locked first, is the decision. None found,
            -- and none excluded as this statement's own, the key is empty
            -- (a waiting job fetched meanwhile is skipped: it runs).
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
            n := 0;
        END IF;
        IF cid IS NOT NULL OR p.max_waiting <> 1 OR p.on_conflict = 'reject' THEN
            -- (the query of sluice_enqueue_policy_waiting, planned once here)
            SELECT count(*)::integer INTO n FROM river_job j
            WHERE j.unique_key BETWEEN prefix || '\x0000000000000000'::bytea AND prefix || '\xffffffffffffffff'::bytea
              AND j.unique_states IS NOT NULL
              AND river_job_state_in_bitmask(j.unique_states, j.state);
        END IF;
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

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_enqueue_policy() RETURNS trigger LANGUAGE plpgsql
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
