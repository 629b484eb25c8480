/// The history's shape as the tests compare it: the kept rows against each user's newest history row, the
/// partitions with their bounds, and a seeded history shared by the latest table's, the read index's and the
/// history move's tests.
package enum HistoryQueries {
    /// Each user's newest history row, as the kept table must hold it: "user id|row id|values…" per user.
    package static let fromHistory = """
        SELECT string_agg(concat_ws('|', user_id, id, bmi, bmr, tdee, version, metrics_date, computed_at), ';' ORDER BY user_id)
        FROM (SELECT DISTINCT ON (user_id) * FROM profile_metrics ORDER BY user_id, computed_at DESC, id DESC) n
        """
    package static let kept = """
        SELECT string_agg(concat_ws('|', user_id, metrics_id, bmi, bmr, tdee, version, metrics_date, computed_at), ';' ORDER BY user_id)
        FROM profile_metrics_latest
        """

    /// Each partition of profile_metrics with its bound, in order: "name bound".
    package static let partitions = """
        SELECT string_agg(c.relname || ' ' || pg_get_expr(c.relpartbound, c.oid), E'\\n' ORDER BY c.relname)
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'profile_metrics'::regclass
        """

    /// `users` users (1…users), each with 12 rows from a month ago to three months ahead (monthly partitions made for
    /// them), formula versions 1 to 3, `computed_at` from the date's start plus a few minutes (equal ones now and
    /// then), written as the daily units would: day by day, users by id.
    package static func seed(users: Int) -> String {
        """
        SELECT metricsd_add_partitions((current_date + interval '5 months')::date);
        INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, \(users)) g;
        INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
        SELECT u, 20 + (u * d) % 90 / 10.0, 1400 + (u * 7 + d) % 600, 1800 + (u * 13 + d) % 1200, 1 + (u + d) % 3,
               current_date - 30 + d * 9,
               (current_date - 30 + d * 9)::timestamptz + interval '5 minutes' * ((u * d) % 4)
        FROM generate_series(0, 11) d CROSS JOIN generate_series(1, \(users)) u
        ORDER BY d, u;
        ANALYZE profile_metrics;
        """
    }
}
