-- A user's time zone change is a settings change: it moves their local date, so their current row is recomputed
-- for the new zone within seconds. The trigger stamps user_settings.updated_at on the database clock (the sweep
-- of missed notifications and the staleness test of the refresh both read it) and NOTIFYs the user id on the
-- channel the daemons already listen to. The refresh then removes the user's rows dated after their current
-- local date in the new zone (days they have not reached there) and writes the row for that date.
CREATE FUNCTION metricsd_timezone_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE user_settings SET updated_at = now() WHERE user_id = NEW.id;
  PERFORM pg_notify('metricsd_settings', NEW.id::text);
  RETURN NULL;
END
$$;

CREATE TRIGGER metricsd_timezone_changed AFTER UPDATE OF timezone ON users
  FOR EACH ROW WHEN (OLD.timezone IS DISTINCT FROM NEW.timezone)
  EXECUTE FUNCTION metricsd_timezone_changed();
