-- The old partition of profile_metrics closed to new dates, and its history moved into monthly partitions online.
--
-- 0015 made the table that held the history the partition of every date below the month after next. On an install
-- that upgraded, that one partition holds years of history, and the daily units keep writing into it until that
-- bound: every user written costs a leaf of its own in its (user_id, computed_at) index, as before the partitions
-- (the History article has the figures), and retention reads a user's leaf for every row it removes. Here:
--
-- 1. The bound 0017 set and 0018 proved becomes the old partition's range (detached and attached again, which the
--    proven constraint lets PostgreSQL do without reading it), and the dates from there to its former bound get
--    partitions of their own: a partition from the bound to the end of its month (named by its first day when that
--    is not the 1st), then whole months. Every date after the newest one it held goes into a monthly partition.
--    Locks: ACCESS EXCLUSIVE on profile_metrics and users (detaching and attaching a partition moves the triggers
--    of its foreign key on users) for milliseconds, taken with a 200 ms lock timeout, retried each second: the
--    history's writers and the daily unit wait at most that; the latest read never does.
--
-- 2. Its rows are then moved into monthly partitions by metricsd, in the background (metricsd_history_move_*
--    below). A row cannot pass from one attached partition to another of the same dates, and the old partition
--    cannot be given a narrower range until it holds none of the rows outside it: so the months are built beside
--    it, as tables not yet attached, and swapped in all at once when they are complete. Meanwhile every reader sees
--    the old partition, and each row once.
--    - Here, for every month the old partition holds (the first of them also takes every older date), an empty
--      table with its key on id and a CHECK of its dates (so that attaching it reads nothing), and a row in
--      history_move_months with its copy cursor. A row trigger on the old partition logs every insert, update and
--      delete of its rows into history_move_log, however they are made (through profile_metrics: the daily units'
--      late rows, retention, a user's deletion; or by name): an insert into the log, no lock, no wait, whatever
--      the writer's isolation level. A TRUNCATE trigger empties the months and the log.
--    - metricsd_history_move_copy first replays the log (below), then copies the next rows of a month in
--      (metrics_date, version, user_id) order through the old partition's date-led key (its heap in the order it
--      was written), in batches of one transaction each. The replay applies, in log order, each logged change to
--      a row the copy has passed (a row ahead of the cursor is copied as it is when the copy gets there): so a
--      month holds every row of the old partition's month as copied, with every change logged since. Copy and
--      replay run under one advisory lock ('metr', 'move'), taken without waiting: one instance at a time, the
--      others find it taken and come back; a writer never waits for them.
--    - Then metricsd builds each month's indexes (CREATE INDEX CONCURRENTLY: sorted, packed, without blocking its
--      writes), its foreign key (NOT VALID, then validated) and its statistics, and keeps replaying the log.
--    - metricsd_history_move_swap replays what is left of the log and detaches the old partition and attaches the
--      months, in one transaction, under ACCESS EXCLUSIVE on profile_metrics (so no write can come between) and
--      users, for milliseconds, 200 ms lock timeout, retried later.
--    - metricsd_history_move_drop drops the old partition, detached: its foreign key first (ACCESS EXCLUSIVE on
--      users for a moment), then the table in a transaction of its own, so that users is not locked while its
--      files are removed.
--    The latest table and the acknowledgements are not touched: rows keep their ids and every column, and nothing
--    is written through profile_metrics. Until the swap the history takes the old partition's space twice.

-- A partition's name: profile_metrics_YYYY_MM for one that starts on the first of its month, profile_metrics_YYYY_MM_DD
-- for one that starts later.
CREATE FUNCTION metricsd_partition_name(start date) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'profile_metrics_' || to_char(start, CASE WHEN extract(day FROM start) = 1 THEN 'YYYY_MM' ELSE 'YYYY_MM_DD' END)
$$;

-- 1. The old partition's new range.
DO $$
DECLARE
  old regclass := (SELECT conrelid FROM pg_constraint WHERE conname = 'profile_metrics_dates_before_bound');
  bound date;
  upper date;
  next date;
  name text;
  renamed text;
  made text[] := '{}';
  attempts integer := 0;
BEGIN
  IF old IS NULL THEN
    RETURN;
  END IF;
  bound := (SELECT substring(pg_get_constraintdef(oid) FROM '''([0-9-]+)''')::date FROM pg_constraint
            WHERE conname = 'profile_metrics_dates_before_bound');
  upper := (SELECT substring(pg_get_expr(relpartbound, oid) FROM 'TO \(''([0-9-]+)''\)')::date FROM pg_class WHERE oid = old);
  -- The new partitions, made apart before any lock is taken (nothing else sees them yet).
  next := bound;
  WHILE next < upper LOOP
    name := metricsd_partition_name(next);
    EXECUTE format('CREATE TABLE %I (LIKE profile_metrics INCLUDING DEFAULTS) WITH (autovacuum_vacuum_scale_factor = 0.02)', name);
    EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id) WITH (fillfactor = 100)', name);
    EXECUTE format('CREATE UNIQUE INDEX %I ON %I (metrics_date, version, user_id)', name || '_date_version_user_key', name);
    EXECUTE format('CREATE INDEX %I ON %I (user_id, computed_at)', name || '_user_computed_at_idx', name);
    made := made || name;
    next := least(upper, (date_trunc('month', next) + interval '1 month')::date);
  END LOOP;

  PERFORM set_config('lock_timeout', '200ms', true);
  LOOP
    BEGIN
      LOCK TABLE profile_metrics, users IN ACCESS EXCLUSIVE MODE;
      EXIT;
    EXCEPTION WHEN lock_not_available THEN
      attempts := attempts + 1;
      IF attempts >= 300 THEN
        RAISE EXCEPTION 'profile_metrics or users stayed locked by other sessions for 5 minutes: stop what holds them (see pg_locks) and migrate again';
      END IF;
      PERFORM pg_sleep(1);
    END;
  END LOOP;

  EXECUTE format('ALTER TABLE profile_metrics DETACH PARTITION %s', old);
  EXECUTE format('ALTER TABLE profile_metrics ATTACH PARTITION %s FOR VALUES FROM (MINVALUE) TO (%L)', old, bound);
  EXECUTE format('ALTER TABLE %s DROP CONSTRAINT profile_metrics_dates_before_bound', old);
  next := bound;
  FOREACH name IN ARRAY made LOOP
    EXECUTE format('ALTER TABLE profile_metrics ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, next, least(upper, (date_trunc('month', next) + interval '1 month')::date));
    next := least(upper, (date_trunc('month', next) + interval '1 month')::date);
  END LOOP;
  -- Its name says its bound.
  renamed := replace(metricsd_partition_name(bound), 'profile_metrics_', 'profile_metrics_until_');
  EXECUTE format('ALTER INDEX IF EXISTS %I RENAME TO %I', old::text || '_date_version_user_key', renamed || '_date_version_user_key');
  EXECUTE format('ALTER INDEX IF EXISTS %I RENAME TO %I', old::text || '_user_computed_at_idx', renamed || '_user_computed_at_idx');
  EXECUTE format('ALTER TABLE %s RENAME TO %I', old, renamed);
END $$;

-- 2. The move.

-- The move of the old partition's rows (one row, made below when it holds any).
CREATE TABLE history_move (
  singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  source        text NOT NULL,                         -- the old partition
  -- copying: months being copied; indexing: every month copied, their indexes being built; swapped: the months
  -- attached, the old partition detached (to be dropped); done: dropped.
  state         text NOT NULL CHECK (state IN ('copying', 'indexing', 'swapped', 'done')),
  rows_estimate bigint NOT NULL,                       -- the old partition's rows, as its statistics said
  created_at    timestamptz NOT NULL DEFAULT now(),
  copied_at     timestamptz,
  swapped_at    timestamptz,
  swap_lock_ms  double precision,                     -- how long the swap held its exclusive locks
  finished_at   timestamptz
);

-- One month of the old partition: the table it is copied into, its dates, how far the copy is.
CREATE TABLE history_move_months (
  partition      text PRIMARY KEY,
  month          date NOT NULL UNIQUE,                 -- its first day
  range_from     date,                                 -- NULL: every older date too (MINVALUE)
  range_to       date NOT NULL,
  copied         boolean NOT NULL DEFAULT false,
  ready          boolean NOT NULL DEFAULT false,       -- indexes, foreign key and statistics made
  -- The last row copied, in (metrics_date, version, user_id) order: the next batch starts after it.
  cursor_date    date NOT NULL,
  cursor_version integer NOT NULL DEFAULT 2147483647,
  cursor_user    bigint NOT NULL DEFAULT 9223372036854775807,
  rows_copied    bigint NOT NULL DEFAULT 0
);

-- The writes to the old partition's rows since the move began, in order, until replayed: an update is logged as
-- the removal of its old row ('D': id and key) and the insert of its new one ('I': every column).
CREATE TABLE history_move_log (
  seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  op           char(1) NOT NULL CHECK (op IN ('I', 'D')),
  id           bigint NOT NULL,
  user_id      bigint NOT NULL,
  bmi          numeric(5,1),
  bmr          integer,
  tdee         integer,
  version      integer NOT NULL,
  metrics_date date NOT NULL,
  computed_at  timestamptz
);

CREATE FUNCTION metricsd_history_move_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP <> 'INSERT' THEN
    INSERT INTO history_move_log (op, id, user_id, version, metrics_date)
    VALUES ('D', OLD.id, OLD.user_id, OLD.version, OLD.metrics_date);
  END IF;
  IF TG_OP <> 'DELETE' THEN
    INSERT INTO history_move_log (op, id, user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
    VALUES ('I', NEW.id, NEW.user_id, NEW.bmi, NEW.bmr, NEW.tdee, NEW.version, NEW.metrics_date, NEW.computed_at);
  END IF;
  RETURN NULL;
END $$;

-- The old partition emptied: so are the months, and the copy starts over (after the batch in hand).
CREATE FUNCTION metricsd_history_move_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  name text;
BEGIN
  PERFORM pg_advisory_xact_lock(1835365490, 1836021349);  -- 'metr', 'move'
  FOR name IN SELECT partition FROM history_move_months LOOP
    EXECUTE format('TRUNCATE %I', name);
  END LOOP;
  TRUNCATE history_move_log;
  UPDATE history_move_months SET copied = false, ready = false, rows_copied = 0,
    cursor_date = coalesce(range_from - 1, '-infinity'), cursor_version = 2147483647, cursor_user = 9223372036854775807;
  UPDATE history_move SET state = 'copying', copied_at = NULL WHERE state = 'indexing';
  RETURN NULL;
END $$;

-- Applies the oldest `batch` entries of the log that have committed, and removes them from it. For each month
-- touched, in one statement each: every row the entries name is removed from the month, then the newest entry of
-- each row, when it is an insert, is inserted. Only rows the copy has passed (the month is copied, or its cursor
-- is at or after the row's key): a row ahead of the cursor is copied as it stands when the copy reaches it.
-- Called under the move's lock. Returns how many entries it applied.
CREATE FUNCTION metricsd_history_move_replay(batch integer) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  entries history_move_log[];
  m history_move_months;
  passed text := $p$ e.metrics_date >= coalesce($2, '-infinity') AND e.metrics_date < $3
                    AND ($4 OR (e.metrics_date, e.version, e.user_id) <= ($5, $6, $7)) $p$;
BEGIN
  WITH taken AS (
    DELETE FROM history_move_log WHERE seq IN (SELECT seq FROM history_move_log ORDER BY seq LIMIT batch)
    RETURNING *
  )
  SELECT array_agg(t ORDER BY t.seq) INTO entries FROM taken t;
  IF entries IS NULL THEN
    RETURN 0;
  END IF;
  FOR m IN
    SELECT * FROM history_move_months h
    WHERE EXISTS (SELECT 1 FROM unnest(entries) e
                  WHERE e.metrics_date < h.range_to AND (h.range_from IS NULL OR e.metrics_date >= h.range_from))
  LOOP
    EXECUTE format('DELETE FROM %I WHERE id IN (SELECT e.id FROM unnest($1) e WHERE %s)', m.partition, passed)
      USING entries, m.range_from, m.range_to, m.copied, m.cursor_date, m.cursor_version, m.cursor_user;
    EXECUTE format(
      'INSERT INTO %I (id, user_id, bmi, bmr, tdee, version, metrics_date, computed_at) '
      'SELECT e.id, e.user_id, e.bmi, e.bmr, e.tdee, e.version, e.metrics_date, e.computed_at '
      'FROM (SELECT DISTINCT ON (x.id) x.* FROM unnest($1) x ORDER BY x.id, x.seq DESC) e '
      'WHERE e.op = ''I'' AND %s', m.partition, passed)
      USING entries, m.range_from, m.range_to, m.copied, m.cursor_date, m.cursor_version, m.cursor_user;
  END LOOP;
  RETURN cardinality(entries);
END $$;

-- One step of the copy: replays the log (at most `batch` entries), then copies the next `batch` rows of the newest
-- month not copied yet and advances its cursor; the month is copied when fewer rows than that are left, and the
-- move goes on to the indexes when every month is. The copy is two statements: the key of the batch's last row
-- (an index-only scan of the old partition's date-led key), then the rows up to it. Returns the month (NULL when
-- another instance holds the move's lock, or only the log was replayed), the rows copied, the log entries
-- replayed, whether that month is now copied, and how many months are left; no row unless the move is copying.
-- Gives up on a table lock it cannot take within 100 ms.
CREATE FUNCTION metricsd_history_move_copy(batch integer)
  RETURNS TABLE (month_partition text, rows_added bigint, replayed integer, month_done boolean, months_left integer)
  LANGUAGE plpgsql AS $$
DECLARE
  src text := (SELECT source FROM history_move WHERE state = 'copying');
  m history_move_months;
  last_date date;
  last_version integer;
  last_user bigint;
BEGIN
  IF src IS NULL THEN
    RETURN;
  END IF;
  month_partition := NULL;
  rows_added := 0;
  replayed := 0;
  month_done := false;
  IF pg_try_advisory_xact_lock(1835365490, 1836021349) THEN  -- 'metr', 'move'
    PERFORM set_config('lock_timeout', '100ms', true);
    replayed := metricsd_history_move_replay(batch);
    SELECT * INTO m FROM history_move_months WHERE NOT copied ORDER BY month DESC LIMIT 1;
    IF FOUND THEN
      EXECUTE format('SELECT metrics_date, version, user_id FROM %I '
                     'WHERE (metrics_date, version, user_id) > ($1, $2, $3) AND metrics_date < $4 '
                     'ORDER BY metrics_date, version, user_id OFFSET $5 - 1 LIMIT 1', src)
        INTO last_date, last_version, last_user
        USING m.cursor_date, m.cursor_version, m.cursor_user, m.range_to, batch;
      EXECUTE format('INSERT INTO %I (id, user_id, bmi, bmr, tdee, version, metrics_date, computed_at) '
                     'SELECT id, user_id, bmi, bmr, tdee, version, metrics_date, computed_at FROM %I '
                     'WHERE (metrics_date, version, user_id) > ($1, $2, $3) AND metrics_date < $4 '
                     '  AND ($5::date IS NULL OR (metrics_date, version, user_id) <= ($5, $6, $7))', m.partition, src)
        USING m.cursor_date, m.cursor_version, m.cursor_user, m.range_to, last_date, last_version, last_user;
      GET DIAGNOSTICS rows_added = ROW_COUNT;
      -- A copied month's cursor stays where its last batch began: every row is passed once the month is copied.
      UPDATE history_move_months h
      SET cursor_date = coalesce(last_date, h.cursor_date), cursor_version = coalesce(last_version, h.cursor_version),
          cursor_user = coalesce(last_user, h.cursor_user), rows_copied = h.rows_copied + rows_added,
          copied = last_date IS NULL
      WHERE h.partition = m.partition;
      month_partition := m.partition;
      month_done := last_date IS NULL;
    END IF;
  END IF;
  months_left := (SELECT count(*) FROM history_move_months WHERE NOT copied);
  IF months_left = 0 AND month_done THEN
    UPDATE history_move SET state = 'indexing', copied_at = now();
  END IF;
  RETURN NEXT;
END $$;

-- After the copy, until the swap: replays the log (at most `batch` entries) under the move's lock. Returns the
-- entries replayed, or -1 when another instance holds the lock.
CREATE FUNCTION metricsd_history_move_catch_up(batch integer) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
  IF NOT pg_try_advisory_xact_lock(1835365490, 1836021349) THEN
    RETURN -1;
  END IF;
  PERFORM set_config('lock_timeout', '100ms', true);
  RETURN metricsd_history_move_replay(batch);
END $$;

-- Replays the rest of the log and detaches the old partition and attaches every month in its place, in one
-- transaction under ACCESS EXCLUSIVE on profile_metrics (and so on the old partition: no write comes between the
-- last replay and the swap) and users, once each month is ready and its keys and foreign key are valid, and the log
-- holds at most `most` entries (more would hold the locks longer: catch up first). False when another instance
-- holds the move's or the partitions' advisory lock, the move is not there yet, the log is longer, or a lock is
-- not granted within 200 ms (the next call tries again).
CREATE FUNCTION metricsd_history_move_swap(most integer) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  src text;
  m history_move_months;
  locked timestamptz;
BEGIN
  IF NOT pg_try_advisory_xact_lock(1835365490, 1836021349)          -- 'metr', 'move'
     OR NOT pg_try_advisory_xact_lock(1835365490, 1885434484) THEN  -- 'metr', 'part': metricsd_add_partitions'
    RETURN false;
  END IF;
  src := (SELECT source FROM history_move WHERE state = 'indexing');
  IF src IS NULL OR EXISTS (SELECT 1 FROM history_move_months WHERE NOT ready)
     OR (SELECT count(*) FROM (SELECT 1 FROM history_move_log LIMIT most + 1) l) > most THEN
    RETURN false;
  END IF;
  IF EXISTS (
    SELECT 1 FROM history_move_months h
    WHERE (SELECT count(*) FROM pg_index x WHERE x.indrelid = h.partition::regclass AND x.indisvalid) < 3
       OR NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conrelid = h.partition::regclass AND c.contype = 'f'
                        AND c.convalidated))
  THEN
    RAISE EXCEPTION 'a month of the history move is marked ready without its keys or its foreign key';
  END IF;
  PERFORM set_config('lock_timeout', '200ms', true);
  BEGIN
    LOCK TABLE profile_metrics, users IN ACCESS EXCLUSIVE MODE;
  EXCEPTION WHEN lock_not_available THEN
    RETURN false;
  END;
  locked := clock_timestamp();
  WHILE metricsd_history_move_replay(10000) > 0 LOOP
  END LOOP;
  EXECUTE format('ALTER TABLE profile_metrics DETACH PARTITION %I', src);
  EXECUTE format('DROP TRIGGER metricsd_history_move ON %I', src);
  EXECUTE format('DROP TRIGGER metricsd_history_move_truncated ON %I', src);
  FOR m IN SELECT * FROM history_move_months ORDER BY month LOOP
    EXECUTE format('ALTER TABLE profile_metrics ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%L)', m.partition,
                   coalesce(quote_literal(m.range_from), 'MINVALUE'), m.range_to);
    -- The partition's range says the same now.
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', m.partition, m.partition || '_dates');
  END LOOP;
  UPDATE history_move SET state = 'swapped', swapped_at = now(),
    swap_lock_ms = extract(epoch FROM clock_timestamp() - locked) * 1000;
  RETURN true;
END $$;

-- Drops the old partition once it is detached: its foreign key in a first call (which removes the key's triggers on
-- users: ACCESS EXCLUSIVE on users for a moment), the table in the next, so that users is not locked while the
-- table's files are removed. Returns 'dropped' when the move is done, 'again' when a next call is needed, 'busy'
-- when another instance holds the partitions' lock or a lock is not granted within 200 ms, and 'idle' when there is
-- nothing to drop.
CREATE FUNCTION metricsd_history_move_drop() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  src text;
  fk text;
BEGIN
  IF NOT pg_try_advisory_xact_lock(1835365490, 1885434484) THEN  -- 'metr', 'part'
    RETURN 'busy';
  END IF;
  src := (SELECT source FROM history_move WHERE state = 'swapped');
  IF src IS NULL THEN
    RETURN 'idle';
  END IF;
  PERFORM set_config('lock_timeout', '200ms', true);
  BEGIN
    IF to_regclass(src) IS NOT NULL THEN
      fk := (SELECT conname FROM pg_constraint WHERE conrelid = src::regclass AND contype = 'f' LIMIT 1);
      IF fk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', src, fk);
        RETURN 'again';
      END IF;
      EXECUTE format('DROP TABLE %I', src);
    END IF;
  EXCEPTION WHEN lock_not_available THEN
    RETURN 'busy';
  END;
  UPDATE history_move SET state = 'done', finished_at = now();
  RETURN 'dropped';
END $$;

-- The months of the old partition, when it holds any row.
DO $$
DECLARE
  old regclass;
  upper date;
  first date;
  month date;
  hi date;
  name text;
BEGIN
  SELECT c.oid, substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([0-9-]+)''\)')::date INTO old, upper
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  WHERE i.inhparent = 'profile_metrics'::regclass AND pg_get_expr(c.relpartbound, c.oid) LIKE 'FOR VALUES FROM (MINVALUE) %';
  IF old IS NULL THEN
    RETURN;
  END IF;
  EXECUTE format('SELECT date_trunc(''month'', min(metrics_date))::date FROM %s', old) INTO first;
  IF first IS NULL THEN
    RETURN;  -- empty: it stays, the partition of every older date
  END IF;
  month := first;
  WHILE month < upper LOOP
    hi := least(upper, (month + interval '1 month')::date);
    name := metricsd_partition_name(month);
    EXECUTE format('CREATE TABLE %I (LIKE profile_metrics INCLUDING DEFAULTS) WITH (autovacuum_vacuum_scale_factor = 0.02)', name);
    EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id) WITH (fillfactor = 100)', name);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (%s metrics_date < %L)', name, name || '_dates',
                   CASE WHEN month = first THEN '' ELSE format('metrics_date >= %L AND', month) END, hi);
    INSERT INTO history_move_months (partition, month, range_from, range_to, cursor_date)
    VALUES (name, month, CASE WHEN month <> first THEN month END, hi,
            CASE WHEN month = first THEN '-infinity'::date ELSE month - 1 END);
    month := hi;
  END LOOP;
  INSERT INTO history_move (source, state, rows_estimate)
  SELECT relname, 'copying', greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = old;
  EXECUTE format('CREATE TRIGGER metricsd_history_move AFTER INSERT OR UPDATE OR DELETE ON %s '
                 'FOR EACH ROW EXECUTE FUNCTION metricsd_history_move_logged()', old);
  EXECUTE format('CREATE TRIGGER metricsd_history_move_truncated AFTER TRUNCATE ON %s '
                 'FOR EACH STATEMENT EXECUTE FUNCTION metricsd_history_move_truncated()', old);
  EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER metricsd_history_move', old);
  EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER metricsd_history_move_truncated', old);
END $$;
