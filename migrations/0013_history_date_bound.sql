-- The first of three steps that partition profile_metrics by month of metrics_date (0015 says why): a bound on its
-- dates, which 0014 proves for the rows already there, so that 0015 can make this table the partition of every
-- date below the bound without reading it. A partition's range is checked when it is attached, by reading the whole
-- table under the lock the attachment holds, unless a proven CHECK constraint already implies it.
--
-- The bound: the first day of the month after next, counted from the latest local date anywhere (UTC+14), or the
-- month after the newest date in the table if that is later. No writer writes a date past the latest local date,
-- so none meets the bound before 0015 replaces it with the partitions of the months from there on.
--
-- NOT VALID: enforced for rows written from now on, not checked for the rows already there. The ALTER TABLE takes
-- an ACCESS EXCLUSIVE lock for a moment (nothing is read).
DO $$
DECLARE
  bound date := greatest(
    date_trunc('month', (now() AT TIME ZONE 'Pacific/Kiritimati')::date) + interval '2 months',
    date_trunc('month', (SELECT max(metrics_date) FROM profile_metrics)) + interval '1 month');
BEGIN
  EXECUTE format('ALTER TABLE profile_metrics ADD CONSTRAINT profile_metrics_dates_before_partitions '
                 'CHECK (metrics_date < %L) NOT VALID', bound);
END $$;
