-- Enqueue policies (policy/): the rows of enqueue_policies, their
-- declarations in Go, and the counts the trigger sluice_enqueue_policy
-- keeps. Durations travel as milliseconds.

-- name: ListEnqueuePolicies :many
-- Every policy in force (enabled), by kind.
SELECT kind, by_args, max_waiting, on_conflict,
       COALESCE((extract(epoch FROM debounce) * 1000)::bigint, 0)::bigint AS debounce_ms,
       COALESCE((extract(epoch FROM max_delay) * 1000)::bigint, 0)::bigint AS max_delay_ms,
       keep_scheduled_at, source, updated_at
FROM enqueue_policies
WHERE enabled
ORDER BY kind;

-- name: SetEnqueuePolicy :exec
-- Writes kind's policy (in force again if it was cleared).
INSERT INTO enqueue_policies AS p (kind, by_args, max_waiting, on_conflict, debounce, max_delay, keep_scheduled_at, enabled)
VALUES (sqlc.arg(kind), sqlc.narg(by_args)::text[], sqlc.arg(max_waiting), sqlc.arg(on_conflict),
        make_interval(secs => sqlc.narg(debounce_ms)::float8 / 1000),
        make_interval(secs => sqlc.narg(max_delay_ms)::float8 / 1000), sqlc.arg(keep_scheduled_at), true)
ON CONFLICT (kind) DO UPDATE
SET by_args = EXCLUDED.by_args, max_waiting = EXCLUDED.max_waiting, on_conflict = EXCLUDED.on_conflict,
    debounce = EXCLUDED.debounce, max_delay = EXCLUDED.max_delay, keep_scheduled_at = EXCLUDED.keep_scheduled_at,
    enabled = true;

-- name: DeleteEnqueuePolicy :execrows
-- Removes kind's policy row.
DELETE FROM enqueue_policies WHERE kind = sqlc.arg(kind);

-- name: DisableEnqueuePolicy :execrows
-- Takes kind's policy out of force, keeping its row (a policy declared in
-- Go that an operator cleared: the operator's change wins until reset).
UPDATE enqueue_policies SET enabled = false WHERE kind = sqlc.arg(kind) AND enabled;

-- name: DeleteEnqueuePolicyCounts :execrows
-- Forgets the outcome counts of kind's keys.
DELETE FROM enqueue_policy_counts WHERE kind = sqlc.arg(kind);

-- name: EnqueuePolicyKeys :many
-- kind's keys, the fullest first (limit: how many; NULL: all).
SELECT kind, key, waiting, max_waiting, on_conflict, inserted, discarded, replaced, debounced, last_enqueue_at
FROM enqueue_policy_keys
WHERE kind = sqlc.arg(kind)
ORDER BY waiting DESC, last_enqueue_at DESC, key
LIMIT sqlc.narg(max_rows)::integer;

-- name: EnqueuePolicyOutcomes :many
-- The outcomes counted, per kind (for sluice_enqueue_outcomes_total).
SELECT kind, outcome, count FROM enqueue_policy_outcomes ORDER BY kind, outcome;

-- name: SetPolicySource :exec
-- The source the transaction's policy changes get: 'sql' or 'config'
-- (trigger enqueue_policies_source).
SELECT set_config('sluice.policy_source', sqlc.arg(source)::text, true);

-- name: LockPolicyDeclarations :exec
-- Serialises the writers of declared policies (workers starting, `policy
-- reset`) for the rest of the transaction; readers are not blocked.
LOCK TABLE enqueue_policy_declarations IN SHARE ROW EXCLUSIVE MODE;

-- name: UpsertPolicyDeclaration :exec
-- Records a policy as the program declares it.
INSERT INTO enqueue_policy_declarations (kind, by_args, max_waiting, on_conflict, debounce, max_delay, keep_scheduled_at, declared_by, updated_at)
VALUES (sqlc.arg(kind), sqlc.narg(by_args)::text[], sqlc.arg(max_waiting), sqlc.arg(on_conflict),
        make_interval(secs => sqlc.narg(debounce_ms)::float8 / 1000),
        make_interval(secs => sqlc.narg(max_delay_ms)::float8 / 1000), sqlc.arg(keep_scheduled_at), sqlc.narg(declared_by), now())
ON CONFLICT (kind) DO UPDATE
SET by_args = EXCLUDED.by_args, max_waiting = EXCLUDED.max_waiting, on_conflict = EXCLUDED.on_conflict,
    debounce = EXCLUDED.debounce, max_delay = EXCLUDED.max_delay, keep_scheduled_at = EXCLUDED.keep_scheduled_at,
    declared_by = EXCLUDED.declared_by, updated_at = now();

-- name: DeleteStalePolicyDeclarations :many
-- Forgets the declarations the program no longer makes (kinds: those it
-- makes), returning their kinds.
DELETE FROM enqueue_policy_declarations
WHERE NOT (kind = ANY (sqlc.arg(kinds)::text[]))
RETURNING kind;

-- name: DeleteDeclaredPolicies :many
-- Removes the policies of kinds that still follow their declaration
-- (source config); one an operator changed stays. Returns those removed.
DELETE FROM enqueue_policies
WHERE kind = ANY (sqlc.arg(kinds)::text[]) AND source = 'config'
RETURNING kind;

-- name: WriteDeclaredPolicy :many
-- Writes the declaration of kind into its policy row: inserted when there
-- is none; rewritten when it differs and still follows its declaration
-- (source config), or always with force (`policy reset`). A row an
-- operator changed (source sql) is left alone unless forced. Returns the
-- kind when it was written.
INSERT INTO enqueue_policies AS p (kind, by_args, max_waiting, on_conflict, debounce, max_delay, keep_scheduled_at, enabled)
SELECT d.kind, d.by_args, d.max_waiting, d.on_conflict, d.debounce, d.max_delay, d.keep_scheduled_at, true
FROM enqueue_policy_declarations d
WHERE d.kind = sqlc.arg(kind)
ON CONFLICT (kind) DO UPDATE
SET by_args = EXCLUDED.by_args, max_waiting = EXCLUDED.max_waiting, on_conflict = EXCLUDED.on_conflict,
    debounce = EXCLUDED.debounce, max_delay = EXCLUDED.max_delay, keep_scheduled_at = EXCLUDED.keep_scheduled_at,
    enabled = true,
    -- the trigger gives source only to a changed definition: a forced reset
    -- of an unchanged one names it here
    source = 'config'
WHERE (p.source = 'config' OR sqlc.arg(force)::boolean)
  AND ((p.by_args, p.max_waiting, p.on_conflict, p.debounce, p.max_delay, p.keep_scheduled_at, p.enabled, p.source)
       IS DISTINCT FROM
       (EXCLUDED.by_args, EXCLUDED.max_waiting, EXCLUDED.on_conflict, EXCLUDED.debounce, EXCLUDED.max_delay,
        EXCLUDED.keep_scheduled_at, true, 'config'))
RETURNING p.kind;

-- name: PolicyDeclared :one
-- Whether kind has a policy declared in Go.
SELECT EXISTS (SELECT 1 FROM enqueue_policy_declarations WHERE kind = sqlc.arg(kind))::boolean AS declared;

-- name: ListOperatorPolicies :many
-- The kinds among those given whose policy row an operator changed or
-- cleared (source sql).
SELECT kind FROM enqueue_policies
WHERE kind = ANY (sqlc.arg(kinds)::text[]) AND source = 'sql'
ORDER BY kind;
