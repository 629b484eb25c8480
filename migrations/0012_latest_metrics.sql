-- profile_metrics_latest: each user's newest metrics row, one row per user, for the latest read.
--
-- The newest row is the one with the latest computed_at (the greater id between two equal ones). Found in
-- profile_metrics it is one backward probe of (user_id, computed_at), whose leaf holding a user's newest entries
-- is, once a user has more rows than a leaf holds (~190, half a year of days), a page of that user's own: the read
-- then needs one 8 KiB leaf per user in memory, and past the server's cache one random read per request. Here it is
-- one probe of a primary key and one row: about 190 bytes per user with the key and the pages' free half (below),
-- whatever the depth of the history (20,000 users: 4 MB; 1,000,000: ~190 MB).
--
-- Triggers keep it, in the statement that writes profile_metrics, so it commits or rolls back with that write and
-- every writer keeps it (the daily units, recompute-all, settings and time zone changes, retention, a user's
-- deletion, and statements typed by an operator). They fire in every session_replication_role (ENABLE ALWAYS):
-- like an index, the table is never out of step with the history.
--   - INSERT: per user, the statement's newest row replaces the kept one if it is newer. The upserts go in user id
--     order, as the batches insert, so two writers lock the same users in the same order.
--   - UPDATE, DELETE: for each user touched, the newest row is looked up again in profile_metrics (an update may
--     change which row is newest; a time zone change deletes rows dated after the user's new local date, which
--     can be the newest). The kept row is replaced only if it is one this statement changed or removed, or is
--     older than the one found: if another transaction has meanwhile kept a newer row and committed, this one
--     waits for that row's lock and then leaves it.
--   - TRUNCATE empties it (with DELETE).
-- The user's row goes with the user (ON DELETE CASCADE).
CREATE TABLE profile_metrics_latest (
  user_id      BIGINT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
  metrics_id   BIGINT NOT NULL,                     -- profile_metrics.id of the row copied here
  bmi          NUMERIC(5,1) NOT NULL,
  bmr          INTEGER NOT NULL,
  tdee         INTEGER NOT NULL,
  version      INTEGER NOT NULL,
  metrics_date DATE NOT NULL,
  computed_at  TIMESTAMPTZ NOT NULL
-- Every row is replaced about once a day. Half of each page is left free so that the new version goes on the same
-- page without an index entry (a HOT update), and the old one is pruned by the next visit to that page.
) WITH (fillfactor = 50);

-- The newest profile_metrics row of each of the users, kept here (`users`: user ids, duplicates allowed). The kept
-- row is replaced when `changed` (profile_metrics ids) holds it or it is older; removed when the user has no row.
-- `changed` is read as a subquery, which PostgreSQL hashes once: `= ANY(changed)` would compare every kept row with
-- every element (a statement changing 200,000 users' rows ran for minutes).
CREATE FUNCTION metricsd_latest_refresh(users BIGINT[], changed BIGINT[]) RETURNS void LANGUAGE sql AS $$
  WITH touched AS (
    SELECT DISTINCT id AS user_id FROM unnest(users) AS t(id)
  ),
  newest AS (
    SELECT t.user_id, p.id, p.bmi, p.bmr, p.tdee, p.version, p.metrics_date, p.computed_at
    FROM touched t
    CROSS JOIN LATERAL (SELECT id, bmi, bmr, tdee, version, metrics_date, computed_at FROM profile_metrics
                        WHERE user_id = t.user_id ORDER BY computed_at DESC, id DESC LIMIT 1) p
  ),
  emptied AS (
    DELETE FROM profile_metrics_latest l
    USING touched t
    WHERE l.user_id = t.user_id AND l.metrics_id IN (SELECT unnest(changed))
      AND NOT EXISTS (SELECT 1 FROM newest n WHERE n.user_id = t.user_id)
  )
  INSERT INTO profile_metrics_latest AS l (user_id, metrics_id, bmi, bmr, tdee, version, metrics_date, computed_at)
  SELECT user_id, id, bmi, bmr, tdee, version, metrics_date, computed_at FROM newest ORDER BY user_id
  ON CONFLICT (user_id) DO UPDATE
    SET metrics_id = excluded.metrics_id, bmi = excluded.bmi, bmr = excluded.bmr, tdee = excluded.tdee,
        version = excluded.version, metrics_date = excluded.metrics_date, computed_at = excluded.computed_at
    WHERE l.metrics_id IN (SELECT unnest(changed))
       OR (l.computed_at, l.metrics_id) < (excluded.computed_at, excluded.metrics_id)
$$;

CREATE FUNCTION metricsd_latest_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO profile_metrics_latest AS l (user_id, metrics_id, bmi, bmr, tdee, version, metrics_date, computed_at)
  SELECT DISTINCT ON (n.user_id) n.user_id, n.id, n.bmi, n.bmr, n.tdee, n.version, n.metrics_date, n.computed_at
  FROM inserted n
  ORDER BY n.user_id, n.computed_at DESC, n.id DESC
  ON CONFLICT (user_id) DO UPDATE
    SET metrics_id = excluded.metrics_id, bmi = excluded.bmi, bmr = excluded.bmr, tdee = excluded.tdee,
        version = excluded.version, metrics_date = excluded.metrics_date, computed_at = excluded.computed_at
    WHERE (l.computed_at, l.metrics_id) < (excluded.computed_at, excluded.metrics_id);
  RETURN NULL;
END $$;

CREATE FUNCTION metricsd_latest_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM metricsd_latest_refresh(
    (SELECT array_agg(user_id) FROM (SELECT user_id FROM updated UNION SELECT user_id FROM previous) u),
    (SELECT array_agg(id) FROM previous));
  RETURN NULL;
END $$;

CREATE FUNCTION metricsd_latest_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- Only users whose kept row was deleted: retention removes old rows, never a user's newest.
  PERFORM metricsd_latest_refresh(array_agg(l.user_id), array_agg(l.metrics_id))
  FROM deleted d JOIN profile_metrics_latest l ON l.user_id = d.user_id AND l.metrics_id = d.id;
  RETURN NULL;
END $$;

-- DELETE, not TRUNCATE: a TRUNCATE of users that cascades here is still using this table when the trigger fires.
CREATE FUNCTION metricsd_latest_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM profile_metrics_latest;
  RETURN NULL;
END $$;

-- No write may land between the copy below and the triggers taking over (instances of the previous release may
-- be writing): profile_metrics' writers wait until this migration commits; its readers go on.
LOCK TABLE profile_metrics IN SHARE ROW EXCLUSIVE MODE;

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

-- Fills the table afresh from profile_metrics: one probe of (user_id, computed_at) per user (about a minute per
-- million users whose leaves are not cached). Here, and after a bulk load that switched the insert trigger off
-- (ALTER TABLE profile_metrics DISABLE TRIGGER metricsd_latest_inserted, then ENABLE ALWAYS TRIGGER): one probe per
-- user instead of sorting every loaded row. It empties the table first (TRUNCATE: readers wait until it commits).
CREATE FUNCTION metricsd_latest_rebuild() RETURNS void LANGUAGE sql AS $$
  TRUNCATE profile_metrics_latest;
  SELECT metricsd_latest_refresh(ARRAY(SELECT id FROM users), '{}');
$$;

SELECT metricsd_latest_rebuild();
ANALYZE profile_metrics_latest;
