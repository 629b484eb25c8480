-- The second of three steps that partition profile_metrics by month (0015 says why): proves the bound 0013 set for
-- the rows already there. It reads the whole table once (about a minute per 50 GB on 2 cores) under a SHARE UPDATE
-- EXCLUSIVE lock: reads and writes go on meanwhile. Its own transaction, so that the next step finds the constraint
-- proven and takes its exclusive lock only for milliseconds.
ALTER TABLE profile_metrics VALIDATE CONSTRAINT profile_metrics_dates_before_partitions;
