-- profile_metrics_latest's update and delete triggers (0012), rewritten so that a statement touching many users
-- costs the same per user at any size, and takes its locks on profile_metrics_latest in one order: ascending user
-- id, the order in which the insert trigger and the daemon's batches take them.
--
-- What they replace: both handed the users and the changed row ids to one set-based refresh as two arrays, which
-- PostgreSQL plans as ten elements each; the refresh's removal of kept rows then compared every kept row with every
-- changed id, so a statement's time grew with the square of the users it emptied (an operator's clean-up of a
-- formula version ran for minutes). That removal also took the kept rows in the order of a hash table: holding one
-- user's kept row, it could wait for another's held by a daily batch that was waiting for the first (a deadlock).
--
-- Now, for the users an UPDATE touched, or whose kept row a DELETE removed (retention removes old rows, never a
-- user's newest, so its batches lock nothing here):
--   1. their kept rows are locked (FOR UPDATE), one user after the other in ascending user id, each through the
--      primary key: a nested loop whatever PostgreSQL estimates;
--   2. a statement of its own, which sees what the transactions it waited for in step 1 committed, looks up each
--      user's newest row (metricsd_history_newest: one probe of each partition's read index) and, for the users
--      whose kept row it locked, makes that the kept row, or removes it when the user has no row left; a user who
--      had no kept row (an UPDATE moved rows to them) gets one, unless another transaction kept a newer one
--      meanwhile.
-- Neither step joins two sets without an index. The delete trigger's search for the kept rows its statement
-- deleted (a join of the deleted rows with the kept ones) is planned for each statement (EXECUTE), not once per
-- session for the first statement's size: a retention batch probes the primary key, a bulk delete hashes.
--
-- Every writer of profile_metrics_latest now takes its locks in ascending user id within each trigger, so two
-- statements touching many users wait for each other and never deadlock there. Which rows of profile_metrics
-- itself a statement locks first is its own plan's doing: the daemon's batches lock no row they leave unchanged
-- and refresh one user per statement, so they hold no history row while waiting for another.
--
-- The insert trigger and the TRUNCATE trigger are unchanged.

-- The users' kept rows, locked in the order of `users` (ascending user ids, no duplicates). Returns, for each, whether
-- a kept row was there to lock.
CREATE FUNCTION metricsd_latest_lock(users bigint[]) RETURNS boolean[] LANGUAGE sql AS $$
  SELECT coalesce(array_agg(l.user_id IS NOT NULL ORDER BY u.n), '{}')
  FROM unnest(users) WITH ORDINALITY AS u(id, n)
  LEFT JOIN LATERAL (SELECT k.user_id FROM profile_metrics_latest k WHERE k.user_id = u.id FOR UPDATE) l ON true
$$;

-- A user's newest history row: the latest computed_at, the greater id between equal ones; the user's first entry in
-- the read index profile_metrics_user_computed_at_idx. One probe of each partition's part of that index. A STABLE
-- SQL function, which PostgreSQL inlines where it is called (so what the refresh runs can be EXPLAINed).
CREATE FUNCTION metricsd_history_newest(user_id bigint) RETURNS SETOF profile_metrics LANGUAGE sql STABLE AS $$
  SELECT * FROM profile_metrics p WHERE p.user_id = metricsd_history_newest.user_id
  ORDER BY p.computed_at DESC, p.id DESC LIMIT 1
$$;

-- Makes the kept row of each of `users` (ascending, no duplicates) the user's newest history row again, or removes
-- it when the user has no row left. Locks the kept rows first (metricsd_latest_lock), then looks the newest rows up
-- in a statement of its own, which sees what the transactions it waited for committed. A user who had no kept row
-- to lock gets the newest row inserted, unless another transaction has meanwhile kept a newer one.
CREATE FUNCTION metricsd_latest_refresh(users bigint[]) RETURNS void LANGUAGE plpgsql
-- JIT compiling a plan of this size costs more than it could save: each user is a few probes.
SET jit = off AS $$
DECLARE
  locked boolean[] := metricsd_latest_lock(users);
BEGIN
  WITH fresh AS MATERIALIZED (
    SELECT u.id AS user_id, u.locked, n.id, n.bmi, n.bmr, n.tdee, n.version, n.metrics_date, n.computed_at
    FROM unnest(users, locked) AS u(id, locked)
    LEFT JOIN LATERAL metricsd_history_newest(u.id) n ON true
  ),
  replaced AS (
    UPDATE profile_metrics_latest l
    SET metrics_id = f.id, bmi = f.bmi, bmr = f.bmr, tdee = f.tdee, version = f.version,
        metrics_date = f.metrics_date, computed_at = f.computed_at
    FROM fresh f
    WHERE l.user_id = f.user_id AND f.locked AND f.id IS NOT NULL
      AND (l.metrics_id, l.bmi, l.bmr, l.tdee, l.version, l.metrics_date, l.computed_at)
          IS DISTINCT FROM (f.id, f.bmi, f.bmr, f.tdee, f.version, f.metrics_date, f.computed_at)
  ),
  emptied AS (
    DELETE FROM profile_metrics_latest l
    USING fresh f
    WHERE l.user_id = f.user_id AND f.locked AND f.id IS NULL
  )
  INSERT INTO profile_metrics_latest AS l (user_id, metrics_id, bmi, bmr, tdee, version, metrics_date, computed_at)
  SELECT f.user_id, f.id, f.bmi, f.bmr, f.tdee, f.version, f.metrics_date, f.computed_at
  FROM fresh f WHERE NOT f.locked AND f.id IS NOT NULL
  ORDER BY f.user_id
  ON CONFLICT (user_id) DO UPDATE
    SET metrics_id = excluded.metrics_id, bmi = excluded.bmi, bmr = excluded.bmr, tdee = excluded.tdee,
        version = excluded.version, metrics_date = excluded.metrics_date, computed_at = excluded.computed_at
    WHERE (l.computed_at, l.metrics_id) < (excluded.computed_at, excluded.metrics_id);
END $$;

CREATE OR REPLACE FUNCTION metricsd_latest_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  users bigint[];
BEGIN
  -- Every INSERT … ON CONFLICT DO UPDATE fires this, mostly with nothing updated.
  IF NOT EXISTS (SELECT 1 FROM previous) THEN
    RETURN NULL;
  END IF;
  SELECT array_agg(user_id ORDER BY user_id) INTO users
  FROM (SELECT user_id FROM previous UNION SELECT user_id FROM updated) u;
  PERFORM metricsd_latest_refresh(users);
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION metricsd_latest_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  users bigint[];
BEGIN
  IF NOT EXISTS (SELECT 1 FROM deleted) THEN
    RETURN NULL;
  END IF;
  -- Only users whose kept row was deleted (retention removes old rows, never a user's newest). Planned for this
  -- statement's number of rows (EXECUTE), not for the first one this session ran.
  EXECUTE 'SELECT array_agg(DISTINCT l.user_id ORDER BY l.user_id)
           FROM deleted d JOIN profile_metrics_latest l ON l.user_id = d.user_id AND l.metrics_id = d.id'
    INTO users;
  IF users IS NOT NULL THEN
    PERFORM metricsd_latest_refresh(users);
  END IF;
  RETURN NULL;
END $$;

-- The rebuild, on the new refresh: every user, in user order.
CREATE OR REPLACE FUNCTION metricsd_latest_rebuild() RETURNS void LANGUAGE sql AS $$
  TRUNCATE profile_metrics_latest;
  SELECT metricsd_latest_refresh(ARRAY(SELECT id FROM users ORDER BY id));
$$;

DROP FUNCTION metricsd_latest_refresh(bigint[], bigint[]);
