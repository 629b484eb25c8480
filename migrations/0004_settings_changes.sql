-- Settings changes wake the daemons: onboarding or a profile edit recomputes the user's current row within
-- seconds. The trigger keeps updated_at on the database clock whenever a value the formulas read changes, and
-- NOTIFYs the user id; a periodic sweep of updated_at catches notifications lost while a daemon was
-- disconnected.
CREATE INDEX user_settings_updated_at_idx ON user_settings (updated_at);

CREATE FUNCTION metricsd_settings_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' OR (OLD.date_of_birth, OLD.gender, OLD.current_weight, OLD.height, OLD.activity_level,
                          OLD.onboarding_completed)
                IS DISTINCT FROM (NEW.date_of_birth, NEW.gender, NEW.current_weight, NEW.height,
                                  NEW.activity_level, NEW.onboarding_completed) THEN
    NEW.updated_at := now();
  END IF;
  RETURN NEW;
END
$$;

CREATE FUNCTION metricsd_settings_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('metricsd_settings', NEW.user_id::text);
  RETURN NULL;
END
$$;

CREATE TRIGGER metricsd_settings_touch BEFORE INSERT OR UPDATE ON user_settings
  FOR EACH ROW EXECUTE FUNCTION metricsd_settings_touch();

CREATE TRIGGER metricsd_settings_notify_insert AFTER INSERT ON user_settings
  FOR EACH ROW EXECUTE FUNCTION metricsd_settings_notify();

CREATE TRIGGER metricsd_settings_notify_update AFTER UPDATE ON user_settings
  FOR EACH ROW WHEN ((OLD.date_of_birth, OLD.gender, OLD.current_weight, OLD.height, OLD.activity_level,
                      OLD.onboarding_completed)
                     IS DISTINCT FROM (NEW.date_of_birth, NEW.gender, NEW.current_weight, NEW.height,
                                       NEW.activity_level, NEW.onboarding_completed))
  EXECUTE FUNCTION metricsd_settings_notify();
