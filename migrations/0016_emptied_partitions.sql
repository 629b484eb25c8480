-- Months that retention has emptied give their space back.
--
-- Retention deletes rows. A month's partition whose dates are all older than the cutoff receives no new rows, so
-- the space its deleted rows leave is never used again: VACUUM gives the heap's empty pages back only from the end
-- of the file, and never shrinks an index. Without this, the history would keep one month of index space for
-- every month it ever held, and its size would not stay flat under retention.
--
-- metricsd_truncate_empty_partitions(before) truncates each monthly partition that ends on or before `before`,
-- holds no row, and still has more than its empty size on disk. TRUNCATE gives the heap and every index a new,
-- empty file. The partition itself stays (a later row for its dates still has a place), and truncating a
-- partition does not fire profile_metrics' own TRUNCATE trigger, so the latest table is untouched.
--
-- Locks: ACCESS EXCLUSIVE on that partition only, for as long as the emptiness check and the TRUNCATE take. The
-- check reads the heap, so only a heap that VACUUM has already cut down (at most 128 pages) is checked; a bigger
-- one waits for a later call. Statements on profile_metrics that do not rule the partition out by date wait
-- meanwhile, and a lock not granted within 100 ms is given up for that partition (the next call tries again), so
-- nothing waits longer than that. Safe on every instance at once: a call that finds metricsd_add_partitions'
-- advisory lock taken returns at once. Returns how many partitions it truncated.
CREATE FUNCTION metricsd_truncate_empty_partitions(before date) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  part regclass;
  empty boolean;
  truncated integer := 0;
BEGIN
  -- metricsd_add_partitions' lock ('metr', 'part'): another instance holding it is doing this or adding months.
  IF NOT pg_try_advisory_xact_lock(1835365490, 1885434484) THEN
    RETURN 0;
  END IF;
  PERFORM set_config('lock_timeout', '100ms', true);
  FOR part IN
    SELECT c.oid::regclass
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'profile_metrics'::regclass
      AND substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([0-9-]+)''\)')::date <= before
      AND pg_relation_size(c.oid) <= 128 * current_setting('block_size')::bigint
      -- An empty btree is its metapage: 8 KiB.
      AND (SELECT coalesce(sum(pg_relation_size(x.indexrelid)), 0) FROM pg_index x WHERE x.indrelid = c.oid)
          > (SELECT count(*) FROM pg_index x WHERE x.indrelid = c.oid) * current_setting('block_size')::bigint
    ORDER BY c.relname
  LOOP
    BEGIN
      EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part);
      EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %s)', part) INTO empty;
      IF empty THEN
        EXECUTE format('TRUNCATE %s', part);
        truncated := truncated + 1;
      END IF;
    EXCEPTION WHEN lock_not_available THEN
      NULL;  -- busy: the next call tries again
    END;
  END LOOP;
  RETURN truncated;
END $$;
