-- Durable work: daily units, recompute jobs, and the one table of claimable chunks both are split into.

-- Zones the database's tz rules know (pg_timezone_names costs ~60 ms a scan; this is a cheap join).
-- Refreshed by the scheduler at start-up and hourly, so a tzdata upgrade on the server is picked up.
CREATE TABLE known_timezones (
  name TEXT PRIMARY KEY
);
INSERT INTO known_timezones (name) SELECT name FROM pg_timezone_names ON CONFLICT DO NOTHING;

-- Finding users by zone (daily units) and the distinct zones in use (a loose index scan) needs this index.
CREATE INDEX users_timezone_id_idx ON users (timezone, id);

-- One daily unit per (zone, local date, formula version): "every user of this zone gets this date's row".
-- Created when the zone's daily time has passed by the database clock; never for a date that is not the
-- zone's current one (no back-filling).
CREATE TABLE daily_units (
  timezone       TEXT NOT NULL,
  local_date     DATE NOT NULL,
  version        INTEGER NOT NULL,
  timezone_known BOOLEAN NOT NULL,                 -- false: every user of the zone is skipped with a reason
  state          TEXT NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'running', 'done', 'superseded')),
  users_total    INTEGER NOT NULL DEFAULT 0,       -- users in the zone when the unit was created
  created_at     TIMESTAMPTZ NOT NULL,             -- when it fell due (database clock)
  started_at     TIMESTAMPTZ,
  finished_at    TIMESTAMPTZ,
  PRIMARY KEY (timezone, local_date, version)
);

-- One recompute-all job per formula version at a time.
CREATE TABLE recompute_jobs (
  id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  version      INTEGER NOT NULL,
  state        TEXT NOT NULL DEFAULT 'pending'
               CHECK (state IN ('pending', 'running', 'done', 'cancelled', 'failed')),
  users_total  BIGINT NOT NULL,
  requested_by TEXT NOT NULL,                      -- 'cli' or 'http'
  created_at   TIMESTAMPTZ NOT NULL,
  started_at   TIMESTAMPTZ,
  finished_at  TIMESTAMPTZ,
  last_error   TEXT
);
CREATE UNIQUE INDEX recompute_jobs_one_active_per_version ON recompute_jobs (version)
  WHERE state IN ('pending', 'running');

-- The claimable pieces of both: a range of user ids (range_start, range_end], worked through in keyset chunks.
-- Claimed with a row lease checked against the database clock; every chunk commit advances cursor_user_id
-- and renews the lease in the same transaction as its upserts, fenced on lease_owner.
CREATE TABLE work_chunks (
  id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind           TEXT NOT NULL CHECK (kind IN ('daily', 'recompute')),
  priority       SMALLINT NOT NULL,                -- 0 daily, 1 recompute: daily work is always claimed first
  timezone       TEXT,                             -- daily only
  local_date     DATE,                             -- daily only
  version        INTEGER NOT NULL,
  job_id         BIGINT REFERENCES recompute_jobs (id) ON DELETE CASCADE,
  range_start    BIGINT NOT NULL,                  -- exclusive
  range_end      BIGINT NOT NULL,                  -- inclusive
  cursor_user_id BIGINT NOT NULL,                  -- last user id whose chunk committed
  state          TEXT NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'running', 'done', 'cancelled', 'superseded')),
  lease_owner    TEXT,
  lease_until    TIMESTAMPTZ,
  attempts       INTEGER NOT NULL DEFAULT 0,
  users_done     INTEGER NOT NULL DEFAULT 0,       -- users with a row for the date and version after this chunk
  users_written  INTEGER NOT NULL DEFAULT 0,       -- rows inserted or changed by this chunk
  users_skipped  INTEGER NOT NULL DEFAULT 0,
  created_at     TIMESTAMPTZ NOT NULL,
  started_at     TIMESTAMPTZ,
  finished_at    TIMESTAMPTZ,
  last_error     TEXT,
  FOREIGN KEY (timezone, local_date, version) REFERENCES daily_units ON DELETE CASCADE,
  CHECK ((kind = 'daily') = (job_id IS NULL)),
  CHECK ((kind = 'daily') = (timezone IS NOT NULL AND local_date IS NOT NULL))
);
CREATE INDEX work_chunks_claimable_idx ON work_chunks (priority, id) WHERE state IN ('pending', 'running');
CREATE INDEX work_chunks_daily_idx ON work_chunks (timezone, local_date, version) WHERE kind = 'daily';
CREATE INDEX work_chunks_job_idx ON work_chunks (job_id) WHERE kind = 'recompute';

-- Users who got no metrics, and why (listed by `metricsd skipped`). One row per user: the latest verdict.
-- Removed when the user next gets metrics.
CREATE TABLE metrics_skips (
  user_id      BIGINT PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
  reason_codes TEXT[] NOT NULL,
  reasons      TEXT NOT NULL,
  metrics_date DATE,
  version      INTEGER NOT NULL,
  source       TEXT NOT NULL CHECK (source IN ('daily', 'recompute', 'settings', 'request')),
  recorded_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX metrics_skips_recorded_at_idx ON metrics_skips (recorded_at DESC);
