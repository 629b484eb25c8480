import MetricsdPostgres

extension SQL {
    // MARK: Finishing and claiming (daily units and recompute jobs alike)

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

    /// Claims the next chunk: daily work first, then recompute work, then (when `$5` is true) retention work, each
    /// in creation order. A chunk is free when pending, or when its lease has expired by the database clock (its
    /// holder crashed or stalled). Marks its unit, job or retention run running, and names the instance whose
    /// expired lease it takes over (not for a chunk handed back on shutdown, which is pending again, nor for a
    /// retry after a recorded failure). Only daily and recompute chunks of this build's formula version are
    /// claimed: during a rolling upgrade each version's instances do their own version's work; retention chunks
    /// (version 0) do not depend on the formulas. `$1` now, `$2` owner, `$3` lease seconds, `$4` formula
    /// version, `$5` retention chunks too. Nothing is claimed when the schema is newer than this build
    /// (`newerSchema`, `$6`).
    static let claimChunk = """
        WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now),
        next AS (
          SELECT c.id, c.state AS previous_state, c.lease_owner AS previous_owner, c.last_error AS previous_error
          FROM work_chunks c
          WHERE (c.version = $4 OR ($5::bool AND c.kind = 'retention'))
            AND (c.state = 'pending' OR (c.state = 'running' AND c.lease_until < (SELECT now FROM clock)))
            AND NOT \(newerSchema("$6"))
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
                    c.cursor_user_id, c.attempts, c.retention_run_id,
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
        ),
        run AS (
          UPDATE retention_runs r SET state = 'running', started_at = coalesce(r.started_at, (SELECT now FROM clock))
          FROM claimed c WHERE c.kind = 'retention' AND r.id = c.retention_run_id AND r.state = 'pending'
          RETURNING 1
        )
        SELECT c.id, c.kind, c.timezone, c.local_date::text, c.version, c.job_id, c.range_start, c.range_end,
               c.cursor_user_id, c.attempts, c.taken_over_from, c.retention_run_id,
               extract(epoch FROM coalesce(u.due_at, u.created_at))::float8,
               CASE WHEN u.timezone_known
                    THEN extract(epoch FROM (coalesce(u.due_at, u.created_at) AT TIME ZONE u.timezone)
                                          - (coalesce(u.due_at, u.created_at) AT TIME ZONE 'UTC'))::int END
        FROM claimed c
        LEFT JOIN daily_units u ON c.kind = 'daily' AND u.timezone = c.timezone AND u.local_date = c.local_date
                                AND u.version = c.version
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
}
