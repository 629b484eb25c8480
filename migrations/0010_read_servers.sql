-- What each instance's latest reads see of their read servers (METRICSD_READ_DATABASE_URL): written with its
-- heartbeat, shown by `metricsd status`. One row per read server, and one (server 'primary') for the reads the
-- primary answered.
CREATE TABLE metricsd_read_servers (
  instance_id TEXT NOT NULL REFERENCES metricsd_instances (instance_id) ON DELETE CASCADE,
  server      TEXT NOT NULL,                     -- host:port, or 'primary'
  usable      BOOLEAN NOT NULL,                  -- reads go there now
  lag_seconds DOUBLE PRECISION,                  -- how far its data may be behind the primary's; NULL: not known
  reads       BIGINT NOT NULL,                   -- users' latest reads it answered since the instance started
  problem     TEXT,                              -- why it is not usable
  updated_at  TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (instance_id, server)
);
