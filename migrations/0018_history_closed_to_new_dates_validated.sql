-- The second of three steps that close the old partition of profile_metrics to new dates (0019 says why): proves
-- the bound 0017 set for the rows already there. It reads the old partition once (about a minute per 50 GB on 2
-- cores) under a SHARE UPDATE EXCLUSIVE lock: reads and writes go on meanwhile. Its own transaction, so that the
-- next step finds the constraint proven and takes its exclusive locks only for milliseconds. Nothing to do when
-- 0017 set no bound.
DO $$
DECLARE
  old regclass := (SELECT conrelid FROM pg_constraint WHERE conname = 'profile_metrics_dates_before_bound');
BEGIN
  IF old IS NOT NULL THEN
    EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT profile_metrics_dates_before_bound', old);
  END IF;
END $$;
