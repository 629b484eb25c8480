-- What operators alert on and what `recompute-all --wait` waits for.

-- The instant a daily unit fell due: the first instant at or after its local date + daily time in its zone.
-- The delay from there to the unit's end is the daily job's lateness (metricsd_daily_unit_delay_seconds).
-- NULL for units created before this column existed.
ALTER TABLE daily_units ADD COLUMN due_at TIMESTAMPTZ;

-- A recompute job that ends (done, cancelled or failed) NOTIFYs its id and state on metricsd_recompute, in
-- the transaction that ends it: a waiting `metricsd recompute-all --wait` learns it at the commit.
CREATE FUNCTION metricsd_recompute_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('metricsd_recompute', NEW.id::text || ' ' || NEW.state);
  RETURN NULL;
END
$$;

CREATE TRIGGER metricsd_recompute_notify AFTER UPDATE OF state ON recompute_jobs
  FOR EACH ROW WHEN (NEW.state IN ('done', 'cancelled', 'failed') AND OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION metricsd_recompute_notify();
