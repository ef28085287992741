-- Queues: a worker serves any queues (`sluice worker --queues
-- default=20,emails=5`, each with its own concurrency) besides the
-- maintenance queue, and records them in its sluice_workers row at
-- registration, so that `sluice queues list` can say which live workers
-- serve a queue and `sluice health` can warn about a queue with available
-- jobs that no live worker serves.

-- +goose Up
ALTER TABLE sluice_workers
    -- The queues the worker serves, each with how many of its jobs it works
    -- at once: {"default": 20, "emails": 5, "maintenance": 4}. NULL: a worker
    -- of a version from before this column, which served the default and
    -- maintenance queues only.
    ADD COLUMN queues jsonb CHECK (queues IS NULL OR jsonb_typeof(queues) = 'object');

COMMENT ON COLUMN sluice_workers.queues IS
    'The queues the worker serves and their concurrency, {"queue": max_workers}, set at registration; NULL: default and maintenance (a worker from before queues were recorded).';

INSERT INTO settings (key, value, description) VALUES
    ('health.queue_paused_after', '"1h"',
     'sluice health warns about a queue paused (sluice queues pause) for longer than this; "0s" turns the check off.')
ON CONFLICT (key) DO NOTHING;

-- +goose Down
DELETE FROM settings WHERE key = 'health.queue_paused_after';
ALTER TABLE sluice_workers DROP COLUMN queues;
