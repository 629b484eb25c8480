-- Every running daemon records a heartbeat, so `metricsd status` can say which instances are alive.
CREATE TABLE metricsd_instances (
  instance_id     TEXT PRIMARY KEY,                -- host:pid:random, also the lease owner of its chunks
  host            TEXT NOT NULL,
  pid             INTEGER NOT NULL,
  build_version   TEXT NOT NULL,
  formula_version INTEGER NOT NULL,
  listen          TEXT NOT NULL,
  started_at      TIMESTAMPTZ NOT NULL,
  last_seen_at    TIMESTAMPTZ NOT NULL,
  stopped_at      TIMESTAMPTZ
);
CREATE INDEX metricsd_instances_last_seen_idx ON metricsd_instances (last_seen_at DESC);
