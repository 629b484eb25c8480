-- Not a migration of metricsd. scripts/test-package adds it to the newer package it builds for the upgrade test
-- (scripts/package --add-migration, which numbers it after the last migration), so that the upgrade brings one
-- migration the installed release does not know, as a real upgrade would. It touches nothing metricsd reads or
-- writes: one table with one row, written by the migration itself.
CREATE TABLE metricsd_upgrade_test (
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO metricsd_upgrade_test DEFAULT VALUES;
