-- Jobs of limited kinds fetched by a worker and not decided yet: written in
-- the transaction of River's fetch, deleted by the job's first decision.
-- Another worker's decision or grant round lets no younger job of the
-- line start before them (a decision is a moment away). A first attempt
-- on the leased path is marked leased: for the other workers' leases it
-- is waiting until its worker's lease keeper publishes what waits (and
-- deletes the mark). Rows older than the window the ledger reads (two
-- seconds) are ignored, and swept.

-- +goose Up
CREATE TABLE concurrency_fetches (
    job_id bigint PRIMARY KEY,
    kind text NOT NULL,
    key text,
    worker_id text NOT NULL,
    fetched_at timestamptz NOT NULL DEFAULT now(),
    leased boolean NOT NULL DEFAULT false
);
COMMENT ON TABLE concurrency_fetches IS
    'Jobs of limited kinds fetched and not decided yet (written with River''s fetch, deleted by their decision): no younger job of their line starts before them.';
CREATE INDEX concurrency_fetches_line_idx ON concurrency_fetches (kind, key, job_id);

-- +goose Down
DROP TABLE concurrency_fetches;
