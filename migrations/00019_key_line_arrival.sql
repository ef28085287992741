-- A key's turn in the round across keys: keys not served since they began
-- to wait (served_at NULL) go first in the order they came (arrived_at),
-- not by name. A key whose row went (no slot, nothing waiting) and that
-- comes back arrives again.

-- +goose Up
ALTER TABLE concurrency_key_lines ADD COLUMN arrived_at timestamptz NOT NULL DEFAULT clock_timestamp();
COMMENT ON COLUMN concurrency_key_lines.arrived_at IS
    'When the row was made (the key took a slot or began to wait): the order of the keys not served yet in the round.';
DROP INDEX concurrency_key_lines_round_idx;
CREATE INDEX concurrency_key_lines_round_idx ON concurrency_key_lines (kind, served_at NULLS FIRST, arrived_at, key) WHERE waiting;

-- +goose Down
DROP INDEX concurrency_key_lines_round_idx;
CREATE INDEX concurrency_key_lines_round_idx ON concurrency_key_lines (kind, served_at NULLS FIRST, key) WHERE waiting;
ALTER TABLE concurrency_key_lines DROP COLUMN arrived_at;
