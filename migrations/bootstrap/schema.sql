-- Creates sluice's schema, where every table, view and function of sluice
-- lives, with the goose version tables of sluice, its modules and the
-- application. Run by `migrate up` before any migration, under the
-- migration lock. /* TEMPLATE: schema */ is the schema's quoted name.
CREATE SCHEMA IF NOT EXISTS /* TEMPLATE: schema */;
