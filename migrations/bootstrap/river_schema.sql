-- Creates River's schema when it is configured and missing, before River's
-- own migrations run in it (rivermigrate does not create it). Run by
-- `migrate up` under the migration lock. /* TEMPLATE: river */ is River's
-- schema's quoted name.
CREATE SCHEMA IF NOT EXISTS /* TEMPLATE: river */;
