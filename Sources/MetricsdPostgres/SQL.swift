/// Every statement metricsd runs, in one place. Values are always parameters (`$n`), never part of the text.
///
/// Statements that depend on the time take the injected instant as `$1` and read the clock as
/// `coalesce($1::timestamptz, now())`: NULL in production (the database's clock, shared by every instance),
/// a fixed instant in tests.
enum SQL {
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

    /// Marks units and jobs done whose chunks all are (normally done by the last chunk; this sweep covers a
    /// crash between a chunk's commit and that step). `$1` now; one unit (`$2` zone, `$3` date, `$4` version),
    /// one job (`$5`), or everything when `$2` and `$5` are both NULL. Returns what it finished.
    static let finishCompletedParents = """
        WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        units AS (
          UPDATE daily_units d SET state = 'done', finished_at = (SELECT now FROM clock)
          WHERE d.state IN ('pending', 'running')
            AND (($2::text IS NULL AND $5::bigint IS NULL)
                 OR (d.timezone = $2 AND d.local_date = $3::date AND d.version = $4))
            AND NOT EXISTS (
              SELECT 1 FROM work_chunks c
              WHERE c.kind = 'daily' AND c.timezone = d.timezone AND c.local_date = d.local_date
                AND c.version = d.version AND c.state <> 'done')
          RETURNING d.timezone, d.local_date, d.version, d.users_total, d.created_at, d.started_at, d.due_at
        ),
        jobs AS (
          UPDATE recompute_jobs j SET state = 'done', finished_at = (SELECT now FROM clock)
          WHERE j.state IN ('pending', 'running') AND (($2::text IS NULL AND $5::bigint IS NULL) OR j.id = $5)
            AND EXISTS (SELECT 1 FROM work_chunks c WHERE c.job_id = j.id)
            AND NOT EXISTS (SELECT 1 FROM work_chunks c WHERE c.job_id = j.id AND c.state <> 'done')
          RETURNING j.id, j.users_total, j.created_at, j.started_at
        )
        SELECT 'unit', u.timezone, u.local_date::text, u.version, u.users_total,
               coalesce(sum(c.users_done), 0), coalesce(sum(c.users_skipped), 0),
               extract(epoch FROM (SELECT now FROM clock) - coalesce(u.started_at, u.created_at))::float8,
               coalesce(sum(c.users_written), 0),
               extract(epoch FROM (SELECT now FROM clock) - coalesce(u.due_at, u.created_at))::float8
        FROM units u
        LEFT JOIN work_chunks c ON c.kind = 'daily' AND c.timezone = u.timezone AND c.local_date = u.local_date
                               AND c.version = u.version
        GROUP BY u.timezone, u.local_date, u.version, u.users_total, u.started_at, u.created_at, u.due_at
        UNION ALL
        SELECT 'job', j.id::text, NULL, NULL, j.users_total,
               coalesce(sum(c.users_done), 0), coalesce(sum(c.users_skipped), 0),
               extract(epoch FROM (SELECT now FROM clock) - coalesce(j.started_at, j.created_at))::float8,
               coalesce(sum(c.users_written), 0), NULL
        FROM jobs j LEFT JOIN work_chunks c ON c.job_id = j.id
        GROUP BY j.id, j.users_total, j.started_at, j.created_at
        """

    /// Whether the database has a migration newer than `parameter` (this build's newest): a newer metricsd
    /// migrated it, and this build writes nothing (its statements may not know the newer schema) but still reads.
    static func newerSchema(_ parameter: String) -> String {
        "EXISTS (SELECT 1 FROM metricsd_migrations m WHERE m.name > \(parameter))"
    }

    // MARK: Claiming (daily units and recompute jobs alike)

    /// Claims the next chunk: daily work first, then recompute work, each in creation order. A chunk is free
    /// when pending, or when its lease has expired by the database clock (its holder crashed or stalled).
    /// Marks its unit or job running, and names the instance whose expired lease it takes over (not for a chunk
    /// handed back on shutdown, which is pending again, nor for a retry after a recorded failure). Only chunks of this build's formula version are claimed: during a rolling
    /// upgrade each version's instances do their own version's work. Nothing is claimed when the schema is newer
    /// than this build (`newerSchema`, `$5`). `$1` now, `$2` owner, `$3` lease seconds, `$4` formula version.
    static let claimChunk = """
        WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        next AS (
          SELECT c.id, c.state AS previous_state, c.lease_owner AS previous_owner, c.last_error AS previous_error
          FROM work_chunks c
          WHERE c.version = $4
            AND (c.state = 'pending' OR (c.state = 'running' AND c.lease_until < (SELECT now FROM clock)))
            AND NOT \(newerSchema("$5"))
          ORDER BY c.priority, c.id
          LIMIT 1
          FOR UPDATE OF c SKIP LOCKED
        ),
        claimed AS (
          UPDATE work_chunks c
          SET state = 'running', lease_owner = $2, lease_until = (SELECT now FROM clock) + make_interval(secs => $3),
              attempts = c.attempts + 1, started_at = coalesce(c.started_at, (SELECT now FROM clock))
          FROM next WHERE c.id = next.id
          RETURNING c.id, c.kind, c.timezone, c.local_date, c.version, c.job_id, c.range_start, c.range_end,
                    c.cursor_user_id, c.attempts,
                    CASE WHEN next.previous_state = 'running' AND next.previous_error IS NULL
                              AND next.previous_owner <> $2
                         THEN next.previous_owner END AS taken_over_from
        ),
        unit AS (
          UPDATE daily_units d SET state = 'running', started_at = coalesce(d.started_at, (SELECT now FROM clock))
          FROM claimed c
          WHERE c.kind = 'daily' AND d.timezone = c.timezone AND d.local_date = c.local_date
            AND d.version = c.version AND d.state = 'pending'
          RETURNING 1
        ),
        job AS (
          UPDATE recompute_jobs j SET state = 'running', started_at = coalesce(j.started_at, (SELECT now FROM clock))
          FROM claimed c WHERE c.kind = 'recompute' AND j.id = c.job_id AND j.state = 'pending'
          RETURNING 1
        )
        SELECT id, kind, timezone, local_date::text, version, job_id, range_start, range_end, cursor_user_id, attempts,
               taken_over_from
        FROM claimed
        """

    /// Gives a chunk back at once (graceful stop): pending again, so a peer may claim it on its next tick, and
    /// does not count it as a lease taken over. `$1` now, `$2` id, `$3` owner.
    static let releaseChunk = """
        UPDATE work_chunks SET lease_until = coalesce($1::timestamptz, now()) - interval '1 millisecond',
                               state = 'pending'
        WHERE id = $2 AND lease_owner = $3 AND state = 'running'
        """

    /// Records a failed attempt and backs off before the chunk may be claimed again (1 s, 2 s, 4 s … 5 min);
    /// the error it records makes the next claim a retry, not a lease taken over.
    /// `$1` now, `$2` id, `$3` owner, `$4` error.
    /// A recompute chunk that failed 10 times fails its job (an operator must look); a daily chunk keeps
    /// retrying, and shows as overdue.
    static let failChunk = """
        WITH failed AS (
          UPDATE work_chunks
          SET lease_until = coalesce($1::timestamptz, now())
                            + make_interval(secs => least(300, power(2, least(attempts, 9)))),
              last_error = left($4, 500),
              state = CASE WHEN kind = 'recompute' AND attempts >= 10 THEN 'cancelled' ELSE state END
          WHERE id = $2 AND lease_owner = $3 AND state = 'running'
          RETURNING job_id, attempts
        ),
        job AS (
          UPDATE recompute_jobs SET state = 'failed', finished_at = coalesce($1::timestamptz, now()),
                                    last_error = left($4, 500)
          WHERE id IN (SELECT job_id FROM failed WHERE attempts >= 10) AND state IN ('pending', 'running')
          RETURNING id
        )
        UPDATE work_chunks SET state = 'cancelled', finished_at = coalesce($1::timestamptz, now())
        WHERE job_id IN (SELECT id FROM job) AND state IN ('pending', 'running') AND id <> $2
        """

    // MARK: Reading users

    /// The columns every way of reading users returns, decoded by `UserRow.decode`.
    /// The local date is the unit's (`$2`) for daily work, else each user's current local date by the database
    /// clock; zones the database does not know use UTC (the user is skipped anyway).
    static func readUsers(where condition: String, order: String, limit: String?) -> String {
        """
        WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now)
        SELECT u.id, u.timezone, k.name IS NOT NULL AS known,
               coalesce($2::date,
                        CASE WHEN k.name IS NOT NULL THEN ((SELECT now FROM clock) AT TIME ZONE u.timezone)::date
                             ELSE ((SELECT now FROM clock) AT TIME ZONE 'UTC')::date END)::text AS local_date,
               s.user_id IS NOT NULL, coalesce(s.onboarding_completed, false), s.date_of_birth::text, s.gender,
               s.current_weight::text, s.height::text, s.activity_level,
               sk.user_id IS NOT NULL AS had_skip, s.updated_at
        FROM users u
        LEFT JOIN user_settings s ON s.user_id = u.id
        LEFT JOIN known_timezones k ON k.name = u.timezone
        LEFT JOIN metrics_skips sk ON sk.user_id = u.id
        WHERE \(condition)
        ORDER BY \(order)\(limit.map { " LIMIT \($0)" } ?? "")
        """
    }

    /// A daily chunk's next users: `$3` zone, users after `$4` up to `$5`, at most `$6`.
    static let readDailyBatch = readUsers(
        where: "u.timezone = $3 AND u.id > $4 AND u.id <= $5", order: "u.id", limit: "$6")

    /// A recompute chunk's next users: after `$3` up to `$4`, at most `$5` (`$2` is NULL).
    static let readRangeBatch = readUsers(where: "u.id > $3 AND u.id <= $4", order: "u.id", limit: "$5")

    /// Given users (`$3` array of ids; `$2` is NULL).
    static let readUsersByID = readUsers(where: "u.id = ANY($3::bigint[])", order: "u.id", limit: nil)

    // MARK: Writing a batch

    /// How a batch's rows meet rows that already exist for the same user, date and version.
    enum Conflict {
        /// Daily units: change the row (and move `computed_at` forward) only if the values differ, so a
        /// repeated or resumed chunk writes nothing twice and leaves acknowledgements alone.
        case updateIfChanged
        /// Recompute jobs: a user who already has the row is left alone.
        case keep
        /// Settings changes (a time zone change is one) and on-demand computation: also refresh a row computed
        /// before the settings last changed, moving `computed_at` forward, and remove the user's rows
        /// dated after their current local date (left by a zone change that moved the local date back).
        case refreshIfStale
    }

    /// One statement that writes a batch atomically: the fence (when `fenced`), the metrics rows, the skip
    /// records of invalid users, and the removal of old skip records of users who now have metrics.
    ///
    /// Fenced form: `$2` chunk id, `$3` owner, `$4` new cursor, `$5` users done, `$6` users skipped,
    /// `$7` lease seconds, `$8` last batch of the chunk (bool). The writes happen only if the fence updated the
    /// chunk, i.e. this worker still holds an unexpired lease: a worker that lost its lease writes nothing.
    /// Both forms: `$1` now, `$9`–`$14` metrics arrays (user ids, bmi, bmr, tdee, dates, settings updated_at),
    /// `$15` version, `$16` skips as JSON, `$17` user ids whose skip record is cleared, `$18` skip source.
    static func writeBatch(_ conflict: Conflict, fenced: Bool) -> String {
        let fence =
            fenced
            ? """
            fence AS (
              UPDATE work_chunks
              SET cursor_user_id = $4, users_done = users_done + $5, users_skipped = users_skipped + $6,
                  lease_until = (SELECT now FROM clock) + make_interval(secs => $7),
                  state = CASE WHEN $8::bool THEN 'done' ELSE 'running' END,
                  finished_at = CASE WHEN $8::bool THEN (SELECT now FROM clock) END, last_error = NULL
              WHERE id = $2 AND lease_owner = $3 AND state = 'running' AND lease_until > (SELECT now FROM clock)
              RETURNING id
            )
            """
            : """
            fence AS (
              SELECT 1 AS id WHERE $2::bigint IS NULL AND $3::text IS NULL AND $4::bigint IS NULL
                AND $5::int IS NULL AND $6::int IS NULL AND $7::float8 IS NULL AND $8::bool IS NULL
            )
            """
        // A daily chunk writes only users still in its zone when it commits: a user who moved to another zone
        // after the chunk read them gets no row (and no skip record) for the old zone's date. The rows are
        // locked FOR SHARE, so a concurrent zone change waits for this commit (and then its refresh sees and
        // removes what no longer fits) or, if it committed first, is seen here.
        let inZone =
            fenced
            ? """
            chunk_zone AS (SELECT timezone FROM work_chunks WHERE id = $2),
            in_zone AS (
              SELECT u.id FROM users u
              WHERE u.id = ANY($9::bigint[] || ARRAY(SELECT (e ->> 'u')::bigint FROM jsonb_array_elements($16::jsonb) e))
                AND u.timezone = (SELECT timezone FROM chunk_zone)
              ORDER BY u.id
              FOR SHARE OF u
            ),
            """ : ""
        // One array of ids, so the users are found through their primary key (an `OR … IN (subquery)` here made
        // PostgreSQL scan every user for every batch); recompute chunks have no zone, lock nothing and keep all.
        let stillInZone =
            fenced ? " AND ((SELECT timezone FROM chunk_zone) IS NULL OR b.user_id IN (SELECT id FROM in_zone))" : ""
        let skipStillInZone =
            fenced ? " AND ((SELECT timezone FROM chunk_zone) IS NULL OR j.u IN (SELECT id FROM in_zone))" : ""
        func insert(onlyNew: Bool) -> String {
            let absent =
                onlyNew
                ? """
                 AND NOT EXISTS (
                      SELECT 1 FROM profile_metrics x
                      WHERE x.user_id = b.user_id AND x.metrics_date = b.metrics_date AND x.version = $15)
                """ : ""
            return """
                INSERT INTO profile_metrics AS pm (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                  SELECT b.user_id, b.bmi, b.bmr, b.tdee, $15, b.metrics_date, b.stamp
                  FROM batch b WHERE EXISTS (SELECT 1 FROM fence)\(stillInZone)\(absent)
                  ORDER BY b.user_id
                """
        }
        let newComputedAt = "greatest(excluded.computed_at, pm.computed_at + interval '1 millisecond')"
        let written: String
        switch conflict {
        case .keep:
            written = """
                written AS (
                  \(insert(onlyNew: false))
                  ON CONFLICT (user_id, metrics_date, version) DO NOTHING
                  RETURNING pm.user_id
                )
                """
        case .updateIfChanged:
            written = """
                written AS (
                  \(insert(onlyNew: false))
                  ON CONFLICT (user_id, metrics_date, version) DO UPDATE
                    SET bmi = excluded.bmi, bmr = excluded.bmr, tdee = excluded.tdee, computed_at = \(newComputedAt)
                    WHERE (pm.bmi, pm.bmr, pm.tdee) IS DISTINCT FROM (excluded.bmi, excluded.bmr, excluded.tdee)
                  RETURNING pm.user_id
                )
                """
        case .refreshIfStale:
            // A row is stale when its values differ or it was computed before the settings last changed; the
            // new computed_at is always after that change, so a second instance handling the same
            // notification finds the row fresh and writes nothing.
            written = """
                refreshed AS (
                  UPDATE profile_metrics pm
                  SET bmi = b.bmi, bmr = b.bmr, tdee = b.tdee,
                      computed_at = greatest(b.stamp, pm.computed_at + interval '1 millisecond')
                  FROM batch b
                  WHERE EXISTS (SELECT 1 FROM fence)\(stillInZone) AND pm.user_id = b.user_id
                    AND pm.metrics_date = b.metrics_date AND pm.version = $15
                    AND ((pm.bmi, pm.bmr, pm.tdee) IS DISTINCT FROM (b.bmi, b.bmr, b.tdee)
                         OR pm.computed_at <= b.settings_updated_at)
                  RETURNING pm.user_id
                ),
                inserted AS (
                  \(insert(onlyNew: true))
                  ON CONFLICT (user_id, metrics_date, version) DO NOTHING
                  RETURNING pm.user_id
                ),
                written AS (SELECT user_id FROM refreshed UNION ALL SELECT user_id FROM inserted),
                -- Rows dated after the user's current local date: left by a time zone change that moved the local
                -- date back (a day not yet reached in the new zone). Never written otherwise: the daily job and
                -- recomputation write no date ahead of the user's current one.
                ahead AS (
                  DELETE FROM profile_metrics pm
                  USING (SELECT b.user_id, b.metrics_date FROM batch b
                         UNION ALL
                         SELECT j.u, j.d FROM jsonb_to_recordset($16::jsonb) AS j(u bigint, d date)) cur
                  WHERE EXISTS (SELECT 1 FROM fence) AND pm.user_id = cur.user_id AND pm.metrics_date > cur.metrics_date
                  RETURNING 1
                )
                """
        }
        // Settings changes stamp computed_at after the change they answer (the sweep's staleness test);
        // scheduled work stamps the run's instant.
        let stamp =
            conflict == .refreshIfStale
            ? "greatest(c.stamp, date_trunc('milliseconds', r.settings_updated_at) + interval '1 millisecond')"
            : "c.stamp"
        return """
            WITH clock AS (
              SELECT coalesce($1::timestamptz, now()) AS now,
                     date_trunc('milliseconds', coalesce($1::timestamptz, clock_timestamp())) AS stamp
            ),
            \(fence),
            \(inZone)
            batch AS (
              SELECT r.*, \(stamp) AS stamp
              FROM unnest($9::bigint[], $10::numeric[], $11::int[], $12::int[], $13::date[], $14::timestamptz[])
                AS r(user_id, bmi, bmr, tdee, metrics_date, settings_updated_at)
              CROSS JOIN clock c
            ),
            \(written),
            skipped AS (
              INSERT INTO metrics_skips AS ms (user_id, reason_codes, reasons, metrics_date, version, source, recorded_at)
              SELECT j.u, string_to_array(j.c, ','), j.r, j.d, $15, $18, (SELECT now FROM clock)
              FROM jsonb_to_recordset($16::jsonb) AS j(u bigint, c text, r text, d date)
              WHERE EXISTS (SELECT 1 FROM fence)\(skipStillInZone)
              ON CONFLICT (user_id) DO UPDATE
                SET reason_codes = excluded.reason_codes, reasons = excluded.reasons,
                    metrics_date = excluded.metrics_date, version = excluded.version, source = excluded.source,
                    recorded_at = excluded.recorded_at
              RETURNING 1
            ),
            cleared AS (
              DELETE FROM metrics_skips WHERE user_id = ANY($17::bigint[]) AND EXISTS (SELECT 1 FROM fence)
              RETURNING 1
            )
            SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM written), (SELECT count(*) FROM skipped)
            """
    }

    // MARK: Serving

    /// The user's newest metrics row, through `profile_metrics_user_computed_at_idx` (never `CURRENT_DATE`),
    /// with the acknowledgement that matches exactly that row, if any. `$1` user id.
    static let latestMetrics = """
        SELECT pm.bmi::text, pm.bmr, pm.tdee, pm.version,
               (extract(epoch FROM pm.computed_at) * 1000)::bigint,
               (extract(epoch FROM a.acknowledged_at) * 1000)::bigint
        FROM (SELECT bmi, bmr, tdee, version, computed_at FROM profile_metrics
              WHERE user_id = $1 ORDER BY computed_at DESC LIMIT 1) pm
        LEFT JOIN metrics_acknowledgements a
          ON a.user_id = $1 AND a.version = pm.version AND a.metrics_computed_at = pm.computed_at
        """

    /// `latestMetrics` for many users in one statement (`$1` a bigint array): one row per user who has metrics,
    /// the user id first. Each user's row is found by the same `LIMIT 1` probe of the `(user_id, computed_at DESC)`
    /// index (a nested loop over the array); users without metrics have no row.
    static let latestMetricsBatch = """
        SELECT u.id, pm.bmi::text, pm.bmr, pm.tdee, pm.version,
               (extract(epoch FROM pm.computed_at) * 1000)::bigint,
               (extract(epoch FROM a.acknowledged_at) * 1000)::bigint
        FROM unnest($1::bigint[]) AS u(id)
        CROSS JOIN LATERAL (SELECT bmi, bmr, tdee, version, computed_at FROM profile_metrics
                            WHERE user_id = u.id ORDER BY computed_at DESC LIMIT 1) pm
        LEFT JOIN metrics_acknowledgements a
          ON a.user_id = u.id AND a.version = pm.version AND a.metrics_computed_at = pm.computed_at
        """

    /// Acknowledges the user's current metrics if they are the ones named (`$2` version, `$3` computed_at in
    /// epoch milliseconds). Idempotent: acknowledging the same metrics again keeps the first `acknowledgedAt`.
    /// Returns: has metrics, names the current ones, acknowledged-at (epoch ms).
    static let acknowledge = """
        WITH latest AS (
          SELECT version, computed_at FROM profile_metrics WHERE user_id = $1 ORDER BY computed_at DESC LIMIT 1
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
