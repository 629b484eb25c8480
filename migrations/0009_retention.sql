-- Retention (METRICSD_RETENTION_DAYS): removing old metrics rows is work like any other, claimed in chunks.
--
-- A retention run removes the rows computed before its cutoff (its creation instant minus the setting's days),
-- except, for each user and formula version, the newest row: no user is ever left without metrics, and a row is
-- removed only when a newer row of its user and version exists that is itself more than three days old (no
-- later change can remove that one: a time zone change removes only rows dated after the user's current date).
-- A run examines the dates that can hold such rows, one chunk per metrics_date, in user-id batches through
-- profile_metrics_date_user_version_key; a weekly run examines every date (users who came back after a long gap).
CREATE TABLE retention_runs (
  id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  days        INTEGER NOT NULL CHECK (days > 0),
  cutoff      TIMESTAMPTZ NOT NULL,                -- rows computed before this may go
  full_pass   BOOLEAN NOT NULL,                    -- every date examined, not only those since the last run
  date_from   DATE,                                -- the dates examined; NULL: none (an empty table)
  date_to     DATE,
  state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'done')),
  created_at  TIMESTAMPTZ NOT NULL,
  started_at  TIMESTAMPTZ,
  finished_at TIMESTAMPTZ
);
-- One run at a time, whichever instance creates it.
CREATE UNIQUE INDEX retention_runs_one_active ON retention_runs ((true)) WHERE state IN ('pending', 'running');

-- Retention chunks: kind 'retention', priority 2 (after daily and recompute work), version 0 (any instance's:
-- they do not depend on the formulas, and instances of an earlier release never claim version 0), local_date the
-- metrics_date examined, cursor_user_id the last user of that date examined, rows_removed what they removed.
ALTER TABLE work_chunks
  ADD COLUMN retention_run_id BIGINT REFERENCES retention_runs (id) ON DELETE CASCADE,
  ADD COLUMN rows_removed BIGINT NOT NULL DEFAULT 0,
  DROP CONSTRAINT work_chunks_kind_check,
  ADD CONSTRAINT work_chunks_kind_check CHECK (kind IN ('daily', 'recompute', 'retention')),
  DROP CONSTRAINT work_chunks_check,
  ADD CONSTRAINT work_chunks_job_check CHECK ((kind = 'recompute') = (job_id IS NOT NULL)),
  ADD CONSTRAINT work_chunks_retention_check
    CHECK ((kind = 'retention') = (retention_run_id IS NOT NULL AND local_date IS NOT NULL AND timezone IS NULL));
CREATE INDEX work_chunks_retention_idx ON work_chunks (retention_run_id) WHERE kind = 'retention';
