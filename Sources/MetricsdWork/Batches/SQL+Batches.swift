import MetricsdPostgres

extension SQL {
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
    package static let readUsersByID = readUsers(where: "u.id = ANY($3::bigint[])", order: "u.id", limit: nil)

    /// The settings sweep: users whose settings changed after `$1` less `$4` minutes, oldest change first, at most
    /// `$3`, who have neither a row of formula version `$2` computed after the change nor a skip record made after
    /// it. The row is looked for through the read index `(user_id, computed_at DESC)`, from the user's newest entry
    /// on: only entries newer than the change are read.
    static let staleSettings = """
        SELECT s.user_id, s.updated_at::text FROM user_settings s
        WHERE s.updated_at > $1::timestamptz - make_interval(mins => $4)
          AND NOT EXISTS (SELECT 1 FROM profile_metrics pm
                          WHERE pm.user_id = s.user_id AND pm.version = $2 AND pm.computed_at > s.updated_at)
          AND NOT EXISTS (SELECT 1 FROM metrics_skips k
                          WHERE k.user_id = s.user_id AND k.recorded_at > s.updated_at)
        ORDER BY s.updated_at LIMIT $3
        """

    // MARK: Writing a batch

    /// Rows of a batch left out of its insert because a row exists for their user, date and version.
    enum Existing {
        case any, sameValues
    }

    /// How a batch's rows meet rows that already exist for the same user, date and version.
    package enum Conflict {
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
        """
        WITH clock AS (
          SELECT coalesce($1::timestamptz, now()) AS now,
                 date_trunc('milliseconds', coalesce($1::timestamptz, clock_timestamp())) AS stamp
        ),
        \(batchFence(fenced: fenced)),
        \(batchZone(fenced: fenced))
        batch AS (
          SELECT r.*, \(batchStamp(conflict)) AS stamp
          FROM unnest($9::bigint[], $10::numeric[], $11::int[], $12::int[], $13::date[], $14::timestamptz[])
            AS r(user_id, bmi, bmr, tdee, metrics_date, settings_updated_at)
          CROSS JOIN clock c
        ),
        \(writtenRows(conflict, also: stillInZone("b.user_id", fenced: fenced))),
        skipped AS (
          INSERT INTO metrics_skips AS ms (user_id, reason_codes, reasons, metrics_date, version, source, recorded_at)
          SELECT j.u, string_to_array(j.c, ','), j.r, j.d, $15, $18, (SELECT now FROM clock)
          FROM jsonb_to_recordset($16::jsonb) AS j(u bigint, c text, r text, d date)
          WHERE EXISTS (SELECT 1 FROM fence)\(stillInZone("j.u", fenced: fenced))
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

    /// The `fence` CTE: with `fenced`, the chunk's progress and lease moved on only while this worker holds an
    /// unexpired lease (one row, else none); without, one row whatever happens, the unused `$2`–`$8` typed.
    static func batchFence(fenced: Bool) -> String {
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
    }

    /// The `chunk_zone` and `in_zone` CTEs of a fenced batch (with their trailing comma), nothing unfenced.
    ///
    /// A daily chunk writes only users still in its zone when it commits: a user who moved to another zone
    /// after the chunk read them gets no row (and no skip record) for the old zone's date. The rows are
    /// locked FOR SHARE, so a concurrent zone change waits for this commit (and then its refresh sees and
    /// removes what no longer fits) or, if it committed first, is seen here.
    static func batchZone(fenced: Bool) -> String {
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
    }

    /// The condition that keeps a fenced batch's `user` (a column) to the users still in its zone; none unfenced.
    ///
    /// One array of ids, so the users are found through their primary key (an `OR … IN (subquery)` here made
    /// PostgreSQL scan every user for every batch); recompute chunks have no zone, lock nothing and keep all.
    static func stillInZone(_ user: String, fenced: Bool) -> String {
        fenced ? " AND ((SELECT timezone FROM chunk_zone) IS NULL OR \(user) IN (SELECT id FROM in_zone))" : ""
    }

    /// The `stamp` of the batch's rows: settings changes stamp computed_at after the change they answer (the
    /// sweep's staleness test); scheduled work stamps the run's instant.
    static func batchStamp(_ conflict: Conflict) -> String {
        conflict == .refreshIfStale
            ? "greatest(c.stamp, date_trunc('milliseconds', r.settings_updated_at) + interval '1 millisecond')"
            : "c.stamp"
    }

    /// The `written` CTE (and those it is made of), `condition` on the batch's rows too: the user id of each row
    /// written.
    static func writtenRows(_ conflict: Conflict, also condition: String) -> String {
        let newComputedAt = "greatest(excluded.computed_at, pm.computed_at + interval '1 millisecond')"
        switch conflict {
        case .keep:
            return """
                written AS (
                  \(insertBatch(leavingOut: nil, also: condition))
                  ON CONFLICT (user_id, metrics_date, version) DO NOTHING
                  RETURNING pm.user_id
                )
                """
        case .updateIfChanged:
            // A row that already holds these values is left out before the upsert: ON CONFLICT DO UPDATE locks
            // the row it meets even when its WHERE then leaves it, and a batch holding one user's row while
            // waiting for another's (deleted by a transaction not committed yet) deadlocks with that transaction
            // when it comes to the first row later. Only rows to change are locked.
            return """
                written AS (
                  \(insertBatch(leavingOut: .sameValues, also: condition))
                  ON CONFLICT (user_id, metrics_date, version) DO UPDATE
                    SET bmi = excluded.bmi, bmr = excluded.bmr, tdee = excluded.tdee, computed_at = \(newComputedAt)
                    WHERE (pm.bmi, pm.bmr, pm.tdee) IS DISTINCT FROM (excluded.bmi, excluded.bmr, excluded.tdee)
                  RETURNING pm.user_id
                )
                """
        case .refreshIfStale:
            return """
                \(refreshedRows(also: condition)),
                inserted AS (
                  \(insertBatch(leavingOut: .any, also: condition))
                  ON CONFLICT (user_id, metrics_date, version) DO NOTHING
                  RETURNING pm.user_id
                ),
                written AS (SELECT user_id FROM refreshed UNION ALL SELECT user_id FROM inserted),
                \(rowsAhead)
                """
        }
    }

    /// The `refreshed` CTE of `.refreshIfStale`: the existing rows the batch changes, `condition` on the batch's
    /// rows too.
    ///
    /// A row is stale when its values differ or it was computed before the settings last changed; the new
    /// computed_at is always after that change, so a second instance handling the same notification finds the
    /// row fresh and writes nothing.
    static func refreshedRows(also condition: String) -> String {
        """
        refreshed AS (
          UPDATE profile_metrics pm
          SET bmi = b.bmi, bmr = b.bmr, tdee = b.tdee,
              computed_at = greatest(b.stamp, pm.computed_at + interval '1 millisecond')
          FROM batch b
          WHERE EXISTS (SELECT 1 FROM fence)\(condition) AND pm.user_id = b.user_id
            AND pm.metrics_date = b.metrics_date AND pm.version = $15
            AND ((pm.bmi, pm.bmr, pm.tdee) IS DISTINCT FROM (b.bmi, b.bmr, b.tdee)
                 OR pm.computed_at <= b.settings_updated_at)
          RETURNING pm.user_id
        )
        """
    }

    /// The `ahead` CTE of `.refreshIfStale`, with the comment that says why.
    static let rowsAhead = """
        -- Rows dated after the user's current local date: left by a time zone change that moved the local
        -- date back (a day not yet reached in the new zone). Never written otherwise: the daily job and
        -- recomputation write no date ahead of the user's current one. Such a row was computed once its
        -- date had begun somewhere (at or after its 00:00 at UTC+14), so only the user's newest entries of
        -- profile_metrics_user_computed_at_idx are looked at, not their whole history.
        ahead AS (
          DELETE FROM profile_metrics pm
          USING (SELECT b.user_id, b.metrics_date FROM batch b
                 UNION ALL
                 SELECT j.u, j.d FROM jsonb_to_recordset($16::jsonb) AS j(u bigint, d date)) cur
          WHERE EXISTS (SELECT 1 FROM fence) AND pm.user_id = cur.user_id AND pm.metrics_date > cur.metrics_date
            AND pm.computed_at >= (cur.metrics_date + 1)::timestamp AT TIME ZONE 'Etc/GMT-14'
          RETURNING 1
        )
        """

    /// The batch's rows inserted in user order (the fence held, `condition` on `b` too), leaving out those whose
    /// user, date and version have a row already (`.any`), or one holding the same values (`.sameValues`).
    static func insertBatch(leavingOut existing: Existing?, also condition: String) -> String {
        let same = existing == .sameValues ? " AND (x.bmi, x.bmr, x.tdee) = (b.bmi, b.bmr, b.tdee)" : ""
        let absent =
            existing == nil
            ? ""
            : """
             AND NOT EXISTS (
                  SELECT 1 FROM profile_metrics x
                  WHERE x.user_id = b.user_id AND x.metrics_date = b.metrics_date AND x.version = $15\(same))
            """
        return """
            INSERT INTO profile_metrics AS pm (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
              SELECT b.user_id, b.bmi, b.bmr, b.tdee, $15, b.metrics_date, b.stamp
              FROM batch b WHERE EXISTS (SELECT 1 FROM fence)\(condition)\(absent)
              ORDER BY b.user_id
            """
    }
}
