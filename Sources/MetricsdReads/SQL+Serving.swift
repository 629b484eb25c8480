import MetricsdPostgres
import MetricsdWork

extension SQL {
    // MARK: Serving

    /// The user's newest metrics row (never by `CURRENT_DATE`), kept in `profile_metrics_latest` by triggers on
    /// `profile_metrics` (one primary-key probe, however deep the history), with the acknowledgement that matches
    /// exactly that row, if any, and the reasons of the user's skip record when there is one (the latest verdict
    /// on the settings was "invalid": a skip record is removed whenever the user gets metrics). `$1` user id.
    static let latestMetrics = """
        SELECT pm.bmi::text, pm.bmr, pm.tdee, pm.version,
               (extract(epoch FROM pm.computed_at) * 1000)::bigint,
               (extract(epoch FROM a.acknowledged_at) * 1000)::bigint, sk.reasons
        FROM profile_metrics_latest pm
        LEFT JOIN metrics_acknowledgements a
          ON a.user_id = $1 AND a.version = pm.version AND a.metrics_computed_at = pm.computed_at
        LEFT JOIN metrics_skips sk ON sk.user_id = $1
        WHERE pm.user_id = $1
        """

    /// `latestMetrics` for many users in one statement (`$1` a bigint array): one row per user who has metrics,
    /// the user id first. Each user's row is found by the same primary-key probe of `profile_metrics_latest` (a
    /// nested loop over the array); users without metrics have no row.
    static let latestMetricsBatch = """
        SELECT u.id, pm.bmi::text, pm.bmr, pm.tdee, pm.version,
               (extract(epoch FROM pm.computed_at) * 1000)::bigint,
               (extract(epoch FROM a.acknowledged_at) * 1000)::bigint, sk.reasons
        FROM unnest($1::bigint[]) AS u(id)
        CROSS JOIN LATERAL (SELECT bmi, bmr, tdee, version, computed_at FROM profile_metrics_latest
                            WHERE user_id = u.id) pm
        LEFT JOIN metrics_acknowledgements a
          ON a.user_id = u.id AND a.version = pm.version AND a.metrics_computed_at = pm.computed_at
        LEFT JOIN metrics_skips sk ON sk.user_id = u.id
        """

    /// Acknowledges the user's current metrics if they are the ones named (`$2` version, `$3` computed_at in
    /// epoch milliseconds). Idempotent: acknowledging the same metrics again keeps the first `acknowledgedAt`.
    /// Returns: has metrics, names the current ones, acknowledged-at (epoch ms). A user with a skip record has no
    /// current metrics (the latest verdict on their settings was "invalid"), as the latest read says.
    static let acknowledge = """
        WITH latest AS (
          SELECT version, computed_at FROM profile_metrics_latest
          WHERE user_id = $1 AND NOT EXISTS (SELECT 1 FROM metrics_skips WHERE user_id = $1)
        ),
        matching AS (
          SELECT * FROM latest WHERE version = $2 AND (extract(epoch FROM computed_at) * 1000)::bigint = $3
        ),
        upserted AS (
          INSERT INTO metrics_acknowledgements AS a (user_id, version, metrics_computed_at, acknowledged_at)
          SELECT $1, m.version, m.computed_at, date_trunc('milliseconds', clock_timestamp()) FROM matching m
          ON CONFLICT (user_id) DO UPDATE
            SET version = excluded.version, metrics_computed_at = excluded.metrics_computed_at,
                acknowledged_at = excluded.acknowledged_at
            WHERE (a.version, a.metrics_computed_at) IS DISTINCT FROM (excluded.version, excluded.metrics_computed_at)
          RETURNING acknowledged_at
        )
        SELECT EXISTS (SELECT 1 FROM latest), EXISTS (SELECT 1 FROM matching),
               (extract(epoch FROM coalesce(
                  (SELECT acknowledged_at FROM upserted),
                  (SELECT a.acknowledged_at FROM metrics_acknowledgements a, matching m
                   WHERE a.user_id = $1 AND a.version = m.version AND a.metrics_computed_at = m.computed_at)))
                * 1000)::bigint
        """
}
