import MetricsdPostgres

extension SQL {
    // MARK: Retention (METRICSD_RETENTION_DAYS)

    /// Creates a retention run when none is pending or running and the cutoff (`$1` now minus `$2` days) has moved
    /// an hour or more past the last finished run's: one chunk per `metrics_date` that can hold rows computed
    /// between the two cutoffs. A row of date D was computed once D had begun somewhere (at or after D 00:00 at
    /// UTC+14) and before it ended everywhere (D + 1 at UTC−12, a day and a half later), so the dates from two days
    /// before the last cutoff to one day after the new one (UTC). A full pass — the first run, and one a week —
    /// starts at the oldest date in the table instead: a user who came back after a long gap has old rows that
    /// were kept as their newest then. A run with no date to examine is done at once. Safe on every instance at
    /// once: the unique index on active runs lets one insert win. Nothing when the schema is newer than this build
    /// (`newerSchema`, `$3`). Returns the new run and its chunk count.
    static let enqueueRetention = """
        WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        last_done AS (SELECT cutoff FROM retention_runs WHERE state = 'done' ORDER BY id DESC LIMIT 1),
        last_full AS (SELECT created_at FROM retention_runs WHERE state = 'done' AND full_pass ORDER BY id DESC LIMIT 1),
        plan AS (
          SELECT c.now - make_interval(days => $2) AS cutoff,
                 coalesce((SELECT created_at FROM last_full) <= c.now - interval '7 days', true) AS full_pass,
                 (SELECT cutoff FROM last_done) AS previous
          FROM clock c
          WHERE NOT EXISTS (SELECT 1 FROM retention_runs WHERE state IN ('pending', 'running'))
            AND NOT \(newerSchema("$3"))
        ),
        due AS (
          SELECT p.cutoff, p.full_pass,
                 CASE WHEN p.full_pass THEN (SELECT min(metrics_date) FROM profile_metrics)
                      ELSE ((p.previous AT TIME ZONE 'UTC') - interval '2 days')::date END AS date_from,
                 ((p.cutoff AT TIME ZONE 'UTC') + interval '1 day')::date AS date_to
          FROM plan p
          WHERE p.full_pass OR p.previous IS NULL OR p.cutoff >= p.previous + interval '1 hour'
        ),
        run AS (
          INSERT INTO retention_runs (days, cutoff, full_pass, date_from, date_to, state, created_at, finished_at)
          SELECT $2, d.cutoff, d.full_pass, d.date_from, d.date_to,
                 CASE WHEN d.date_from <= d.date_to THEN 'pending' ELSE 'done' END, (SELECT now FROM clock),
                 CASE WHEN d.date_from <= d.date_to THEN NULL ELSE (SELECT now FROM clock) END
          FROM due d
          ON CONFLICT DO NOTHING
          RETURNING id, cutoff, full_pass, date_from, date_to, state, created_at
        ),
        chunks AS (
          INSERT INTO work_chunks (kind, priority, local_date, version, retention_run_id, range_start, range_end,
                                   cursor_user_id, created_at)
          SELECT 'retention', 2, g::date, 0, r.id, -9223372036854775808, 9223372036854775807, -9223372036854775808,
                 r.created_at
          FROM run r CROSS JOIN LATERAL generate_series(r.date_from, r.date_to, interval '1 day') g
          WHERE r.state = 'pending'
          RETURNING 1
        )
        SELECT id, (extract(epoch FROM cutoff) * 1000)::bigint, full_pass, date_from::text, date_to::text,
               (SELECT count(*) FROM chunks)
        FROM run
        """

    /// One batch of a retention chunk, fenced on its lease like every batch: the next users (at most `$6` rows of
    /// date `$5` after user `$4`, whole users: when the page is full its last user is left for the next batch),
    /// and of their rows of that date those computed before the run's cutoff (run `$7`) that have a newer row of
    /// the same user and formula version computed more than three days before now — so the newest row of each
    /// user and version stays, and so does any row whose newer ones are recent (only a recent row can be removed
    /// by anything else: a time zone change removes rows dated after the user's current date). Rows are found
    /// through `profile_metrics_date_version_user_key`, where a date's rows lie together by formula version: the
    /// versions of the date are found by one probe each, each version's next users by a range scan, and the page is
    /// the first of them by user id. The newer row is looked for first on the next day, through the same date-led
    /// key: the batch's users are in id order, so their next-day entries lie together in a few leaves, and so do
    /// their heap rows, written together (a probe of `profile_metrics_user_computed_at_idx` would read each user's
    /// own leaf: once a partition holds more than half a year, a page per row removed, which out of memory is a
    /// random read each). Then in the week of dates after the batch's (the partitions of one or two months), and
    /// only then in every partition (a user who came back after a gap), through
    /// `profile_metrics_user_computed_at_idx`.
    /// Deleting takes only the removed rows' locks: no read or write of a current row waits on it. `$1` now, `$2`
    /// chunk id, `$3` owner, `$8` lease seconds.
    /// Returns: fenced (0 or 1), rows removed, whether this was the chunk's last batch, the new cursor.
    static let retentionBatch = """
        WITH RECURSIVE clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        versions (v) AS (
          SELECT min(version) FROM profile_metrics WHERE metrics_date = $5::date
          UNION ALL
          SELECT (SELECT min(version) FROM profile_metrics WHERE metrics_date = $5::date AND version > d.v)
          FROM versions d WHERE d.v IS NOT NULL
        ),
        page AS (
          SELECT p.user_id
          FROM versions d
          CROSS JOIN LATERAL (SELECT user_id FROM profile_metrics
                              WHERE metrics_date = $5::date AND version = d.v AND user_id > $4
                              ORDER BY user_id LIMIT $6) p
          WHERE d.v IS NOT NULL
          ORDER BY p.user_id LIMIT $6
        ),
        edge AS (
          SELECT count(*) < $6 AS last_batch,
                 CASE WHEN count(*) < $6 THEN NULL WHEN min(user_id) = max(user_id) THEN max(user_id)
                      ELSE max(user_id) - 1 END AS upto
          FROM page
        ),
        fence AS (
          UPDATE work_chunks
          SET cursor_user_id = coalesce((SELECT upto FROM edge), range_end),
              lease_until = (SELECT now FROM clock) + make_interval(secs => $8),
              state = CASE WHEN (SELECT last_batch FROM edge) THEN 'done' ELSE 'running' END,
              finished_at = CASE WHEN (SELECT last_batch FROM edge) THEN (SELECT now FROM clock) END, last_error = NULL
          WHERE id = $2 AND lease_owner = $3 AND state = 'running' AND lease_until > (SELECT now FROM clock)
          RETURNING id
        ),
        removed AS (
          DELETE FROM profile_metrics pm
          WHERE EXISTS (SELECT 1 FROM fence)
            AND pm.metrics_date = $5::date AND pm.version = ANY ((SELECT array_agg(v) FROM versions WHERE v IS NOT NULL)::int[])
            AND pm.user_id > $4
            AND pm.user_id <= coalesce((SELECT upto FROM edge), 9223372036854775807)
            AND pm.computed_at < (SELECT cutoff FROM retention_runs WHERE id = $7)
            AND (EXISTS (SELECT 1 FROM profile_metrics w
                         WHERE w.metrics_date = $5::date + 1 AND w.version = pm.version AND w.user_id = pm.user_id
                           AND w.computed_at > pm.computed_at AND w.computed_at < (SELECT now FROM clock) - interval '3 days')
                 OR EXISTS (SELECT 1 FROM profile_metrics w
                            WHERE w.metrics_date > $5::date AND w.metrics_date <= $5::date + 7
                              AND w.user_id = pm.user_id AND w.computed_at > pm.computed_at
                              AND w.computed_at < (SELECT now FROM clock) - interval '3 days' AND w.version = pm.version)
                 OR EXISTS (SELECT 1 FROM profile_metrics w
                            WHERE w.user_id = pm.user_id AND w.computed_at > pm.computed_at
                              AND w.computed_at < (SELECT now FROM clock) - interval '3 days' AND w.version = pm.version))
          RETURNING 1
        )
        SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM removed), (SELECT last_batch FROM edge),
               coalesce((SELECT upto FROM edge), 9223372036854775807)
        """

    /// Whether daily or recompute work of formula version `$2` is waiting (pending, or its lease expired by `$1`):
    /// a retention chunk then hands itself back between batches, so it never delays them by more than a batch.
    static let higherPriorityWaiting = """
        SELECT EXISTS (
          SELECT 1 FROM work_chunks
          WHERE state IN ('pending', 'running') AND priority < 2 AND version = $2
            AND (state = 'pending' OR lease_until < coalesce($1::timestamptz, now())))
        """

    /// Marks done the retention runs whose chunks are all done: one run (`$2`) after its last chunk, or every
    /// run when `$2` is NULL. Returns each: id, cutoff (epoch ms), days, rows removed, seconds from its first
    /// claim (or creation) to now.
    static let finishRetentionRuns = """
        WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        runs AS (
          UPDATE retention_runs r SET state = 'done', finished_at = (SELECT now FROM clock)
          WHERE r.state IN ('pending', 'running') AND ($2::bigint IS NULL OR r.id = $2)
            AND NOT EXISTS (SELECT 1 FROM work_chunks c
                            WHERE c.kind = 'retention' AND c.retention_run_id = r.id AND c.state <> 'done')
          RETURNING r.id, r.cutoff, r.days, r.created_at, r.started_at
        )
        SELECT r.id, (extract(epoch FROM r.cutoff) * 1000)::bigint, r.days, coalesce(sum(c.rows_removed), 0),
               extract(epoch FROM (SELECT now FROM clock) - coalesce(r.started_at, r.created_at))::float8
        FROM runs r LEFT JOIN work_chunks c ON c.kind = 'retention' AND c.retention_run_id = r.id
        GROUP BY r.id, r.cutoff, r.days, r.created_at, r.started_at
        """

    /// Where retention stands for `$2` days at `$1` now: the latest run (id, state, cutoff epoch ms, full pass,
    /// chunks done, chunks, rows removed, created/finished epoch ms) and how far removal is behind: the new
    /// cutoff minus the last finished run's (before any, minus the oldest date in the table), in seconds, never
    /// negative. No row when retention never ran and the table is empty.
    static let retentionStatus = """
        WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        latest AS (SELECT * FROM retention_runs ORDER BY id DESC LIMIT 1),
        progress AS (
          SELECT count(*) FILTER (WHERE c.state = 'done') AS done, count(*) AS total,
                 coalesce(sum(c.rows_removed), 0) AS removed
          FROM work_chunks c WHERE c.kind = 'retention' AND c.retention_run_id = (SELECT id FROM latest)
        ),
        reference AS (
          SELECT coalesce((SELECT cutoff FROM retention_runs WHERE state = 'done' ORDER BY id DESC LIMIT 1),
                          (SELECT min(metrics_date)::timestamp AT TIME ZONE 'UTC' FROM profile_metrics)) AS cutoff
        )
        SELECT l.id, l.state, (extract(epoch FROM l.cutoff) * 1000)::bigint, l.full_pass, p.done, p.total, p.removed,
               (extract(epoch FROM l.created_at) * 1000)::bigint, (extract(epoch FROM l.finished_at) * 1000)::bigint,
               greatest(0, extract(epoch FROM ((SELECT now FROM clock) - make_interval(days => $2))
                                              - (SELECT cutoff FROM reference)))::float8
        FROM (SELECT 1) one
        LEFT JOIN latest l ON true
        CROSS JOIN progress p
        """
}
