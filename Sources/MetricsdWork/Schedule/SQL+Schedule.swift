import MetricsdPostgres

/// Every statement metricsd runs, in one place. Values are always parameters (`$n`), never part of the text.
///
/// Statements that depend on the time take the injected instant as `$1` and read the clock as
/// `coalesce($1::timestamptz, now())`: NULL in production (the database's clock, shared by every instance),
/// a fixed instant in tests.
package enum SQL {
    // MARK: Schedule: the one place that decides when a zone's daily run is due

    /// Each time zone in use, whether the database knows it, its local time now, and its **due date**: the latest
    /// local date whose daily time has passed, `local_now::date - (local_now::time < daily_at)`, or the date
    /// before that when that one never existed in the zone (below).
    ///
    /// Evaluated on the database's clock and tz rules. This wall-clock predicate gives exactly the rule
    /// of the daily schedule: the run falls due at the first instant at or after D + daily time local; in a DST gap that is the
    /// first instant after the gap (local time jumps past the daily time); in an overlap the date is already
    /// due at the first occurrence and the (zone, date, version) key makes the second one a no-op.
    /// Zones PostgreSQL does not know follow UTC, so their users are still listed as skipped once a day.
    ///
    /// A local date that never existed in the zone (no instant of its 00:00–24:00 happened there, e.g.
    /// Pacific/Apia 2011-12-30, when Samoa crossed the date line) is never due: the due date is the latest
    /// *existing* date whose daily time has passed, so between the first instant of the next date and its daily
    /// time the zone's due date stays the day before the jump, whose unit already exists. A date exists when its
    /// first or its last microsecond, turned into an instant and back by the database's rules, falls on that date
    /// (PostgreSQL resolves a local time in a gap with the offset before the transition, which carries a skipped
    /// date forward onto the next one). Only dates before today need the test (today exists: it is now), so it
    /// runs only between local midnight and the daily time. It is exact for any single transition; only a day
    /// with two forward jumps that together swallow its start and its end but not its middle would be misread,
    /// and tzdata has none.
    ///
    /// Parameters: `$1` now (NULL = `now()`), `$2` daily time (`HH:MM`). The zones come from a loose index scan
    /// over `users (timezone, id)`: one probe per distinct zone, not a scan of every user.
    static let zoneScheduleCTE = """
        RECURSIVE zones(timezone) AS (
          (SELECT timezone FROM users ORDER BY timezone LIMIT 1)
          UNION ALL
          SELECT (SELECT u.timezone FROM users u WHERE u.timezone > z.timezone ORDER BY u.timezone LIMIT 1)
          FROM zones z WHERE z.timezone IS NOT NULL
        ),
        clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        local AS (
          SELECT z.timezone, k.name IS NOT NULL AS known,
                 CASE WHEN k.name IS NOT NULL THEN c.now AT TIME ZONE z.timezone
                      ELSE c.now AT TIME ZONE 'UTC' END AS local_now
          FROM zones z CROSS JOIN clock c LEFT JOIN known_timezones k ON k.name = z.timezone
          WHERE z.timezone IS NOT NULL
        ),
        schedule AS (
          SELECT l.timezone, l.known, l.local_now,
                 CASE WHEN l.local_now::time >= $2::time THEN l.local_now::date
                      WHEN NOT l.known THEN l.local_now::date - 1
                      ELSE (SELECT l.local_now::date - g
                            FROM generate_series(1, 3) g
                            WHERE (((l.local_now::date - g)::timestamp AT TIME ZONE l.timezone)
                                   AT TIME ZONE l.timezone)::date = l.local_now::date - g
                               OR (((l.local_now::date - g + 1)::timestamp - interval '1 microsecond')
                                   AT TIME ZONE l.timezone AT TIME ZONE l.timezone)::date = l.local_now::date - g
                            ORDER BY g LIMIT 1)
                 END AS due_date
          FROM local l
        )
        """

    /// For reporting only (overdue ages in `metricsd status` and `/metrics`): each zone's due date and the
    /// instant its daily time fell due, `due_at`: the first instant whose local time is at or after
    /// `due_date + daily_at`. Never built from components with `AT TIME ZONE` alone, which resolves a gap an
    /// hour late and an overlap at the second occurrence: the candidates between the earliest and the latest
    /// possible offset are stepped minute by minute (one candidate outside DST changes). Follows
    /// `zoneScheduleCTE`; same parameters.
    static let dueInstantCTE = """
        due AS (
          SELECT s.timezone, s.known, s.due_date, s.due_date + $2::time AS local_due,
                 CASE WHEN s.known THEN (s.due_date + $2::time) AT TIME ZONE s.timezone
                      ELSE (s.due_date + $2::time) AT TIME ZONE 'UTC' END AS pg_due
          FROM schedule s
        ),
        due_at AS (
          SELECT d.timezone, d.known, d.due_date,
                 CASE WHEN NOT d.known THEN d.pg_due ELSE (
                   SELECT min(t) FROM generate_series(
                     (d.local_due - greatest(
                        ((d.pg_due - interval '1 day') AT TIME ZONE d.timezone)
                          - ((d.pg_due - interval '1 day') AT TIME ZONE 'UTC'),
                        ((d.pg_due + interval '1 day') AT TIME ZONE d.timezone)
                          - ((d.pg_due + interval '1 day') AT TIME ZONE 'UTC'))) AT TIME ZONE 'UTC',
                     d.pg_due, interval '1 minute') AS t
                   WHERE (t AT TIME ZONE d.timezone) >= d.local_due)
                 END AS due_at
          FROM due d
        )
        """

    /// Creates the daily unit of every zone whose due date has no unit yet, split into chunks of about `$4` users
    /// of the zone (the last one open-ended, so users who arrive while it runs are included), and supersedes
    /// older unfinished units of those zones: their date is no longer current, and metricsd does not back-fill.
    /// Never creates a unit for a date older than one that exists. One statement, so one round trip per tick
    /// and all or nothing. `$3` formula version. Records each unit's due instant (`dueInstantCTE`), from which
    /// its delay is measured. Creates nothing when the schema is newer than this build (`newerSchema`, `$5`).
    /// Returns the new units and their chunk counts.
    static let enqueueDueUnits = """
        WITH \(zoneScheduleCTE), \(dueInstantCTE),
        new_units AS (
          INSERT INTO daily_units (timezone, local_date, version, timezone_known, users_total, created_at, due_at)
          SELECT s.timezone, s.due_date, $3, s.known, (SELECT count(*) FROM users u WHERE u.timezone = s.timezone),
                 (SELECT now FROM clock), s.due_at
          FROM due_at s
          WHERE NOT EXISTS (
            SELECT 1 FROM daily_units d
            WHERE d.timezone = s.timezone AND d.version = $3 AND d.local_date >= s.due_date)
            AND NOT \(newerSchema("$5"))
          ON CONFLICT DO NOTHING
          RETURNING timezone, local_date, version, created_at
        ),
        bounds AS (
          SELECT n.timezone, n.local_date, n.version, n.created_at, b.lo, b.hi
          FROM new_units n
          CROSS JOIN LATERAL (
            SELECT lag(x.id, 1, -9223372036854775808) OVER (ORDER BY x.id) AS lo,
                   CASE WHEN x.n = x.total THEN 9223372036854775807 ELSE x.id END AS hi
            FROM (SELECT u.id, row_number() OVER (ORDER BY u.id) AS n, count(*) OVER () AS total
                  FROM users u WHERE u.timezone = n.timezone) x
            WHERE x.n % $4 = 0 OR x.n = x.total
          ) b
        ),
        chunks AS (
          INSERT INTO work_chunks (kind, priority, timezone, local_date, version, range_start, range_end,
                                   cursor_user_id, created_at)
          SELECT 'daily', 0, timezone, local_date, version, lo, hi, lo, created_at FROM bounds
          RETURNING timezone, local_date
        ),
        superseded_units AS (
          UPDATE daily_units d SET state = 'superseded', finished_at = (SELECT now FROM clock)
          FROM new_units n
          WHERE d.timezone = n.timezone AND d.version = n.version AND d.local_date < n.local_date
            AND d.state IN ('pending', 'running')
          RETURNING 1
        ),
        superseded_chunks AS (
          UPDATE work_chunks c SET state = 'superseded', finished_at = (SELECT now FROM clock)
          FROM new_units n
          WHERE c.kind = 'daily' AND c.timezone = n.timezone AND c.version = n.version
            AND c.local_date < n.local_date AND c.state IN ('pending', 'running')
          RETURNING 1
        )
        SELECT n.timezone, n.local_date::text, (SELECT count(*) FROM chunks c WHERE c.timezone = n.timezone)
        FROM new_units n ORDER BY n.timezone
        """
}
