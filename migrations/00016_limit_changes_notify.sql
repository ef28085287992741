-- Every change of a kind's limits (a limit row inserted or deleted, or one
-- of its limits updated) notifies sluice_limits with the kind as payload,
-- when its transaction commits: every worker LISTENs and re-reads its copy
-- of the limits at once (its poll, once a second, stays as the fallback).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION sluice_limits_notify() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('sluice_limits', OLD.kind);
    ELSE
        PERFORM pg_notify('sluice_limits', NEW.kind);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER sluice_limits_notify
    AFTER INSERT OR DELETE OR UPDATE OF max_concurrency, partition_fields, key_max, rate_max, rate_period, rate_per_key
    ON concurrency_limits
    FOR EACH ROW EXECUTE FUNCTION sluice_limits_notify();

-- +goose Down
DROP TRIGGER sluice_limits_notify ON concurrency_limits;
DROP FUNCTION sluice_limits_notify();
