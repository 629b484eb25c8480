-- The first of three steps that close the old partition of profile_metrics to new dates (0019 says why): a bound
-- right after the newest date it holds, which 0018 proves for the rows already there, so that 0019 can attach it
-- again with that bound without reading it (as 0013 and 0014 did for 0015).
--
-- The old partition is the table that held the history before 0015, attached as the partition of every date below
-- the month after next: an install that upgraded keeps writing the rest of the current month, and the next month,
-- into the partition that holds its whole history. The new bound: the day after the newest date it holds; not
-- before the first day of the current month at the earliest local date anywhere (UTC−12), so that a partition
-- holding no recent rows is bound at the month, and never after its present bound (an install that upgraded long
-- ago already writes into monthly partitions: nothing is done).
--
-- NOT VALID: enforced for rows written from now on, not checked for the rows already there. The ALTER TABLE takes
-- an ACCESS EXCLUSIVE lock on the old partition for a moment (nothing is read). A row dated on or after the bound
-- and written before 0019 commits is refused: no writer writes a date past the newest one until a time zone in use
-- reaches its next day, and a daily unit that does meanwhile fails its batch and retries it after 0019.
DO $$
DECLARE
  old regclass;
  upper date;
  newest date;
  bound date;
BEGIN
  SELECT c.oid, substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([0-9-]+)''\)')::date INTO old, upper
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  WHERE i.inhparent = 'profile_metrics'::regclass AND pg_get_expr(c.relpartbound, c.oid) LIKE 'FOR VALUES FROM (MINVALUE) %';
  IF old IS NULL THEN
    RETURN;
  END IF;
  EXECUTE format('SELECT max(metrics_date) FROM %s', old) INTO newest;
  bound := least(upper, greatest(date_trunc('month', (now() AT TIME ZONE 'Etc/GMT+12')::date)::date, newest + 1));
  IF bound < upper THEN
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT profile_metrics_dates_before_bound CHECK (metrics_date < %L) NOT VALID',
                   old, bound);
  END IF;
END $$;
