-- metricsd:no-transaction
-- The read index as the product's design names it: profile_metrics_user_computed_at_idx ON profile_metrics
-- (user_id, computed_at DESC), each user's entries newest first.
--
-- 0008 had made it ascending (user_id, computed_at), read backwards for the newest row, because on one table the
-- descending order left more free space per entry. Since then the latest read has its own table
-- (profile_metrics_latest, 0012) and the history is partitioned by month (0015), so each partition's index holds
-- at most a month of a user's entries, and the direction no longer decides how full its pages are (the History
-- article has the bytes per user-day of both). What reads this index for a user's newest row (the latest table's
-- refresh, retention's newer-row check, the settings sweep) reads it forwards now. Everything in it is the same
-- key, so no query changes: an index can be read in either direction.
--
-- Built without stopping the history's writers: this file runs outside a transaction, statement by statement
-- (Migrator), and every statement finds what an earlier, interrupted run already did and leaves it, so a run that
-- stops anywhere is finished by the next one. The new index is found by its columns, not by its name, because
-- the last statements give it the old index's name.
--
-- Locks, in order (the History article has the times measured on two years of history):
--   1. metricsd_add_partitions replaced: months made from now on get the descending index.
--   2. CREATE INDEX … ON ONLY profile_metrics: the partitioned index, on the parent alone, invalid until every
--      partition has its part. SHARE on the parent for a moment: writes through profile_metrics wait, reads go on.
--   3. For each partition without its part: CREATE INDEX CONCURRENTLY (SHARE UPDATE EXCLUSIVE on that partition:
--      its reads and writes go on; it waits for the transactions running when it starts, and reads the partition
--      twice), then ALTER INDEX … ATTACH PARTITION (a moment: ACCESS EXCLUSIVE on the new part, which a query
--      planned on that partition opens, SHARE UPDATE EXCLUSIVE on the partitioned index). An index an
--      interrupted build left invalid is dropped first (DROP INDEX CONCURRENTLY).
--   4. DROP INDEX of the old ascending index, once the new one is valid: ACCESS EXCLUSIVE on profile_metrics and
--      every partition for a moment (a partitioned index cannot be dropped concurrently), so it gives up after
--      two seconds when another session is in the way and is tried again, never queueing every reader behind it.
--   5. The new index and its parts renamed to the old names (SHARE UPDATE EXCLUSIVE on each index, a moment).
-- An instance of an earlier release that starts with --migrate meanwhile waits for the migration lock inside a
-- statement, which CREATE INDEX CONCURRENTLY waits for in turn: PostgreSQL ends one of the two as a deadlock, and
-- the next start of whichever failed carries on.

-- 1. As in 0015, with the read index descending.
CREATE OR REPLACE FUNCTION metricsd_add_partitions(upto date) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  last date;
  name text;
  created integer := 0;
BEGIN
  PERFORM set_config('lock_timeout', '2s', true);
  PERFORM pg_advisory_xact_lock(1835365490, 1885434484);  -- 'metr', 'part' (0x6d657472, 0x70617274)
  SELECT max(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([0-9-]+)''\)')::date) INTO last
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  WHERE i.inhparent = 'profile_metrics'::regclass;
  WHILE last <= upto LOOP
    name := 'profile_metrics_' || to_char(last, 'YYYY_MM');
    EXECUTE format('CREATE TABLE %I (LIKE profile_metrics INCLUDING DEFAULTS) '
                   'WITH (autovacuum_vacuum_scale_factor = 0.02)', name);
    EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id) WITH (fillfactor = 100)', name);
    EXECUTE format('CREATE UNIQUE INDEX %I ON %I (metrics_date, version, user_id)', name || '_date_version_user_key', name);
    EXECUTE format('CREATE INDEX %I ON %I (user_id, computed_at DESC)', name || '_user_computed_at_idx', name);
    EXECUTE format('WITH moved AS (DELETE FROM profile_metrics_default WHERE metrics_date >= %L AND metrics_date < %L '
                   'RETURNING *) INSERT INTO %I SELECT * FROM moved', last, last + interval '1 month', name);
    EXECUTE format('ALTER TABLE profile_metrics ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, last, last + interval '1 month');
    last := last + interval '1 month';
    created := created + 1;
  END LOOP;
  RETURN created;
END $$;

-- The read index of a table (user_id, computed_at), ascending or descending, found by its columns. A function of this
-- session only (pg_temp), gone when the migration's connection closes.
CREATE OR REPLACE FUNCTION pg_temp.metricsd_read_index(relation regclass, descending boolean) RETURNS regclass
LANGUAGE sql STABLE AS $$
  SELECT x.indexrelid::regclass FROM pg_index x
  WHERE x.indrelid = relation AND x.indnatts = 2
    AND pg_get_indexdef(x.indexrelid, 1, true) = 'user_id' AND pg_get_indexdef(x.indexrelid, 2, true) = 'computed_at'
    AND ((x.indoption[1] & 1) = 1) = descending
  ORDER BY x.indexrelid LIMIT 1
$$;

-- 2.
DO $$
BEGIN
  PERFORM set_config('lock_timeout', '2s', true);
  IF pg_temp.metricsd_read_index('profile_metrics', true) IS NULL THEN
    CREATE INDEX profile_metrics_user_computed_at_desc_idx ON ONLY profile_metrics (user_id, computed_at DESC);
  END IF;
END $$;

-- 3. Per partition without its part, in name order: a leftover invalid index dropped, the part built and attached.
WITH missing AS (
  SELECT c.oid AS partition, c.relname, c.relname || '_user_computed_at_desc_idx' AS part
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  WHERE i.inhparent = 'profile_metrics'::regclass
    AND NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_inherits a ON a.inhrelid = x.indexrelid
                    WHERE x.indrelid = c.oid AND a.inhparent = pg_temp.metricsd_read_index('profile_metrics', true))
)
SELECT statement FROM (
  SELECT m.relname, 1 AS step, format('DROP INDEX CONCURRENTLY %s', x.indexrelid::regclass) AS statement
  FROM missing m JOIN pg_index x ON x.indrelid = m.partition JOIN pg_class c ON c.oid = x.indexrelid
  WHERE NOT x.indisvalid AND c.relname = m.part
  UNION ALL
  SELECT m.relname, 2, format('CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON %I (user_id, computed_at DESC)', m.part, m.relname)
  FROM missing m
  UNION ALL
  SELECT m.relname, 3, format('ALTER INDEX %s ATTACH PARTITION %I', pg_temp.metricsd_read_index('profile_metrics', true), m.part)
  FROM missing m
) s
ORDER BY relname, step
\gexec

-- 4.
DO $$
DECLARE
  old regclass := pg_temp.metricsd_read_index('profile_metrics', false);
BEGIN
  IF old IS NULL THEN
    RETURN;
  END IF;
  IF NOT (SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = pg_temp.metricsd_read_index('profile_metrics', true)) THEN
    RAISE EXCEPTION 'the descending read index is not valid: a partition of profile_metrics has no part of it';
  END IF;
  PERFORM set_config('lock_timeout', '2s', true);
  EXECUTE format('DROP INDEX %s', old);
END $$;

-- 5. The partitioned index first, then each part whose name is not its partition's name and _user_computed_at_idx.
SELECT statement FROM (
  SELECT 0 AS n, NULL::name AS relname,
         format('ALTER INDEX %s RENAME TO profile_metrics_user_computed_at_idx', i.index) AS statement
  FROM (SELECT pg_temp.metricsd_read_index('profile_metrics', true) AS index) i
  WHERE i.index::text <> 'profile_metrics_user_computed_at_idx'
  UNION ALL
  SELECT 1, c.relname, format('ALTER INDEX %s RENAME TO %I', i.index, c.relname || '_user_computed_at_idx')
  FROM pg_inherits p
  JOIN pg_class c ON c.oid = p.inhrelid
  CROSS JOIN LATERAL (SELECT pg_temp.metricsd_read_index(c.oid, true) AS index) i
  WHERE p.inhparent = 'profile_metrics'::regclass
    AND i.index::text <> quote_ident(c.relname || '_user_computed_at_idx')
    AND to_regclass(quote_ident(c.relname || '_user_computed_at_idx')) IS NULL
) s
ORDER BY n, relname
\gexec

DROP FUNCTION pg_temp.metricsd_read_index(regclass, boolean);
