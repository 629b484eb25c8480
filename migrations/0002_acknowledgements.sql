-- What the user saw and confirmed. One row per user: the latest acknowledgement.
-- It counts only while the user's latest metrics row still has this version and computed_at; a recomputation
-- moves computed_at forward, so changed metrics are unacknowledged again without touching this table.
CREATE TABLE metrics_acknowledgements (
  user_id             BIGINT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
  version             INTEGER NOT NULL,
  metrics_computed_at TIMESTAMPTZ NOT NULL,
  acknowledged_at     TIMESTAMPTZ NOT NULL
);
