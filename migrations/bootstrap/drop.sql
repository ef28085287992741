-- Run by `migrate down --to 0 --river` once every migration is rolled back:
-- drops the goose version tables of sluice, its modules and the
-- application, then the schema itself unless something else still lives in
-- it.
DO $$
DECLARE
    t regclass;
BEGIN
    FOR t IN SELECT c.oid::regclass FROM pg_class c
             WHERE c.relnamespace = to_regnamespace('/* TEMPLATE: schema */')
               AND c.relkind = 'r' AND c.relname LIKE 'goose\_db\_version%' LOOP
        EXECUTE format('DROP TABLE %s', t);
    END LOOP;
    BEGIN
        DROP SCHEMA IF EXISTS /* TEMPLATE: schema */;
    EXCEPTION WHEN dependent_objects_still_exist THEN
        RAISE NOTICE 'schema % kept: it still holds other objects', '/* TEMPLATE: schema */';
    END;
END
$$;
