-- A key's turn in the round across keys: keys take their turns in the
-- order they began waiting for them, each from its last turn or, never
-- served, from its arrival (COALESCE(served_at, arrived_at)): a queue of
-- keys, each going to its back when served. Keys never served went first
-- of all before, and a key whose row went (no slot, nothing waiting)
-- between two of its jobs came back as a key never served: it took a
-- second and a third turn ahead of keys served before it that still
-- waited (torture seed 996502126), and a stream of new keys could hold
-- back a key served once for as long as new keys kept coming.

-- +goose Up
DROP INDEX concurrency_key_lines_round_idx;
CREATE INDEX concurrency_key_lines_round_idx ON concurrency_key_lines (kind, (COALESCE(served_at, arrived_at)), key) WHERE waiting;

-- +goose Down
DROP INDEX concurrency_key_lines_round_idx;
CREATE INDEX concurrency_key_lines_round_idx ON concurrency_key_lines (kind, served_at NULLS FIRST, arrived_at, key) WHERE waiting;
