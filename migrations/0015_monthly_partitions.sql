-- profile_metrics partitioned by month of metrics_date.
--
-- Each day the daily units add an entry per user to (user_id, computed_at), on that user's own leaf page once a user
-- has more rows than a leaf holds (about half a year). On one table that is a leaf per user from an index that
-- grows for ever: past the server's memory, every user written is a random read, and after each checkpoint a
-- full-page image in the WAL. Partitioned by month, a day's rows go into the current month's partition, whose
-- indexes hold at most a month of each user's entries: what a day touches is the same size at any depth of history.
-- The latest read does not look at this table (profile_metrics_latest); the writers name metrics_date (the
-- exactly-once key leads with it), so a write touches one partition.
--
-- The table keeps its name, columns, identity, keys and triggers:
--   - The rows already there stay where they are: the table becomes the partition of every date below the bound
--     that 0013 set and 0014 proved (the month after next, so the current month's rows still go there), with its
--     indexes attached as the partitioned indexes' parts (nothing is read, rebuilt or copied). The months from the
--     bound on get partitions of their own (metricsd_add_partitions, below, which metricsd calls as it runs, two
--     months ahead), and a default partition takes any date no partition covers, so no insert ever fails for want
--     of one.
--   - A key of a partitioned table must hold the partition key, so the key on id is each partition's own (ids come
--     from one identity, so they stay unique).
--   - The latest table's triggers move to the partitioned table (a statement on it fires them once, whatever
--     partitions it touches).
-- Locks: ACCESS EXCLUSIVE on profile_metrics until this commits (renaming it needs that): its writers and the
-- history's readers wait; the latest read does not. Nothing is read or rewritten, so it takes milliseconds.
LOCK TABLE profile_metrics IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
  bound date := (SELECT substring(pg_get_constraintdef(oid) FROM '''([0-9-]+)''')::date FROM pg_constraint
                 WHERE conrelid = 'profile_metrics'::regclass AND conname = 'profile_metrics_dates_before_partitions');
  old text := 'profile_metrics_until_' || to_char(bound, 'YYYY_MM');
  next_id bigint := nextval(pg_get_serial_sequence('profile_metrics', 'id'));
BEGIN
  DROP TRIGGER metricsd_latest_inserted ON profile_metrics;
  DROP TRIGGER metricsd_latest_updated ON profile_metrics;
  DROP TRIGGER metricsd_latest_deleted ON profile_metrics;
  DROP TRIGGER metricsd_latest_truncated ON profile_metrics;
  EXECUTE format('ALTER TABLE profile_metrics RENAME TO %I', old);
  EXECUTE format('ALTER INDEX profile_metrics_date_version_user_key RENAME TO %I', old || '_date_version_user_key');
  EXECUTE format('ALTER INDEX profile_metrics_user_computed_at_idx RENAME TO %I', old || '_user_computed_at_idx');
  EXECUTE format('ALTER TABLE %I ALTER COLUMN id DROP IDENTITY', old);

  CREATE TABLE profile_metrics (
    id           BIGINT GENERATED ALWAYS AS IDENTITY,
    user_id      BIGINT NOT NULL CONSTRAINT profile_metrics_user_id_fkey REFERENCES users(id) ON DELETE CASCADE,
    bmi          NUMERIC(5,1) NOT NULL,
    bmr          INTEGER NOT NULL,
    tdee         INTEGER NOT NULL,
    version      INTEGER NOT NULL,                    -- formula version
    metrics_date DATE NOT NULL,                       -- the user's local date the row is for
    computed_at  TIMESTAMPTZ NOT NULL DEFAULT now()
  ) PARTITION BY RANGE (metrics_date);
  PERFORM setval(pg_get_serial_sequence('profile_metrics', 'id'), next_id, false);
  CREATE UNIQUE INDEX profile_metrics_date_version_user_key ON ONLY profile_metrics (metrics_date, version, user_id);
  CREATE INDEX profile_metrics_user_computed_at_idx ON ONLY profile_metrics (user_id, computed_at);

  EXECUTE format('ALTER TABLE profile_metrics ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)', old, bound);
  EXECUTE format('ALTER INDEX profile_metrics_date_version_user_key ATTACH PARTITION %I', old || '_date_version_user_key');
  EXECUTE format('ALTER INDEX profile_metrics_user_computed_at_idx ATTACH PARTITION %I', old || '_user_computed_at_idx');
  -- The partition's range says the same now.
  EXECUTE format('ALTER TABLE %I DROP CONSTRAINT profile_metrics_dates_before_partitions', old);
  -- Its foreign key to users, the same as the partitioned table's, becomes that key's part (nothing is checked).
END $$;

CREATE TABLE profile_metrics_default (LIKE profile_metrics INCLUDING DEFAULTS);
ALTER TABLE profile_metrics_default ADD PRIMARY KEY (id);
CREATE UNIQUE INDEX profile_metrics_default_date_version_user_key ON profile_metrics_default (metrics_date, version, user_id);
CREATE INDEX profile_metrics_default_user_computed_at_idx ON profile_metrics_default (user_id, computed_at);
ALTER TABLE profile_metrics ATTACH PARTITION profile_metrics_default DEFAULT;

-- The partitions after the last one, a month each, until `upto` is covered: each created apart and then attached
-- (SHARE UPDATE EXCLUSIVE on profile_metrics: its readers and writers go on; CREATE TABLE … PARTITION OF would
-- take ACCESS EXCLUSIVE). Rows the default partition holds for that month move into it first. Safe on every
-- instance at once (an advisory lock: the second finds the partitions there). Gives up on a lock it cannot take
-- within two seconds (the next call tries again). Returns how many it created.
CREATE FUNCTION metricsd_add_partitions(upto date) RETURNS integer LANGUAGE plpgsql AS $$
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
    EXECUTE format('CREATE INDEX %I ON %I (user_id, computed_at)', name || '_user_computed_at_idx', name);
    EXECUTE format('WITH moved AS (DELETE FROM profile_metrics_default WHERE metrics_date >= %L AND metrics_date < %L '
                   'RETURNING *) INSERT INTO %I SELECT * FROM moved', last, last + interval '1 month', name);
    EXECUTE format('ALTER TABLE profile_metrics ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, last, last + interval '1 month');
    last := last + interval '1 month';
    created := created + 1;
  END LOOP;
  RETURN created;
END $$;

SELECT metricsd_add_partitions((now() + interval '2 months')::date);

CREATE TRIGGER metricsd_latest_inserted AFTER INSERT ON profile_metrics
  REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION metricsd_latest_inserted();
CREATE TRIGGER metricsd_latest_updated AFTER UPDATE ON profile_metrics
  REFERENCING OLD TABLE AS previous NEW TABLE AS updated FOR EACH STATEMENT EXECUTE FUNCTION metricsd_latest_updated();
CREATE TRIGGER metricsd_latest_deleted AFTER DELETE ON profile_metrics
  REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION metricsd_latest_deleted();
CREATE TRIGGER metricsd_latest_truncated AFTER TRUNCATE ON profile_metrics
  FOR EACH STATEMENT EXECUTE FUNCTION metricsd_latest_truncated();
ALTER TABLE profile_metrics ENABLE ALWAYS TRIGGER metricsd_latest_inserted;
ALTER TABLE profile_metrics ENABLE ALWAYS TRIGGER metricsd_latest_updated;
ALTER TABLE profile_metrics ENABLE ALWAYS TRIGGER metricsd_latest_deleted;
ALTER TABLE profile_metrics ENABLE ALWAYS TRIGGER metricsd_latest_truncated;
