import HealthMetrics
import MetricsdPostgres

/// A recompute-all job and its progress, as `GET /v1/admin/recompute/{id}` and `metricsd recompute-status` show it.
public struct RecomputeJob: Sendable, Hashable {
    public enum State: String, Sendable {
        case pending, running, done, cancelled, failed
        public var isFinished: Bool { self == .done || self == .cancelled || self == .failed }
    }
    public let id: Int64
    public let version: Int
    public let state: State
    /// Users when the job was created, and what the job came to so far: of the users examined, written, already
    /// current and skipped.
    public let counts: WorkCounts
    public let createdAt: Timestamp
    public let startedAt: Timestamp?
    public let finishedAt: Timestamp?
    public let lastError: String?
    /// Seconds between start and finish (or now).
    public let elapsedSeconds: Double?

    public var usersTotal: Int64 { self.counts.total }
    public var usersExamined: Int64 { self.counts.examined }
    public var usersWritten: Int64 { self.counts.written }
    public var usersAlreadyCurrent: Int64 { self.counts.alreadyCurrent }
    public var usersSkipped: Int64 { self.counts.skipped }

    /// Percent of users examined, 0–100.
    public var percent: Double {
        guard self.usersTotal > 0 else { return self.state == .done ? 100 : 0 }
        return min(100, Double(self.usersExamined) * 100 / Double(self.usersTotal))
    }

    /// Users examined per second since the job started.
    public var ratePerSecond: Double? {
        guard let elapsed = self.elapsedSeconds, elapsed > 0, self.startedAt != nil else { return nil }
        return Double(self.usersExamined) / elapsed
    }

    /// Seconds left at the current rate; nil when finished or not started.
    public var etaSeconds: Double? {
        guard !self.state.isFinished, let rate = self.ratePerSecond, rate > 0 else { return nil }
        return max(0, Double(self.usersTotal - self.usersExamined) / rate)
    }
}

/// Creating, reading and cancelling recompute jobs. Their chunks are claimed and processed by `WorkQueue`,
/// exactly like daily units.
public struct RecomputeJobs: Sendable {
    public let pool: PostgresPool
    public let chunkSize: Int

    public init(pool: PostgresPool, chunkSize: Int = WorkQueue.Configuration().chunkSize) {
        self.pool = pool
        self.chunkSize = chunkSize
    }

    /// What a trigger came to.
    public enum TriggerOutcome: Sendable, Hashable {
        /// A new job; its chunks wait for the workers.
        case created(RecomputeJob)
        /// The pending or running job of this version (one at a time).
        case active(RecomputeJob)
        /// Every user already has a row of this version for their current local date, or a skip verdict for it
        /// newer than their settings: no job. `latest` is the newest finished job of the version, if any.
        case nothingToDo(latest: RecomputeJob?)

        public var job: RecomputeJob? {
            switch self {
            case .created(let job), .active(let job): job
            case .nothingToDo(let latest): latest
            }
        }

        public var created: Bool {
            if case .created = self { return true }
            return false
        }
    }

    /// Creates the job for `version`, split into user-id ranges of about `chunkSize` users, unless one is
    /// pending or running (then that one is returned), or unless there is nothing to do.
    ///
    /// Safe with several instances triggering at once: the check and the insert are one statement, and the
    /// unique index on active jobs lets one insert win; the others wait for it and return it.
    public func trigger(version: Int, requestedBy: String) async throws -> TriggerOutcome {
        var attempts = 1
        while true {
            do {
                return try await self.triggerOnce(version: version, requestedBy: requestedBy)
            } catch is RetryTrigger where attempts < 5 {
                attempts += 1  // the active job finished meanwhile: the next insert creates a new one
            }
        }
    }

    private struct RetryTrigger: Error {}

    private enum Inserted {
        case created(Int64)
        case active(Int64)
        case nothingToDo(Int64?)
    }

    /// A user needs work when they have neither this version's row for their current local date (UTC for zones
    /// the database does not know, as the workers read them) nor a skip verdict of this version for that date
    /// recorded after their settings last changed. The row is looked for per user (`OFFSET 0` keeps the subquery
    /// from becoming a join): the user's date is then known when it runs, so it probes the exactly-once key of
    /// that date's partition only, where a join probed every partition's `(user_id, computed_at DESC)` index and
    /// read each user's whole history.
    static let needsWork = """
        EXISTS (
          SELECT 1 FROM users u
          LEFT JOIN known_timezones k ON k.name = u.timezone
          LEFT JOIN user_settings s ON s.user_id = u.id
          CROSS JOIN LATERAL (SELECT CASE WHEN k.name IS NOT NULL THEN (now() AT TIME ZONE u.timezone)::date
                                          ELSE (now() AT TIME ZONE 'UTC')::date END AS local_date) d
          WHERE NOT EXISTS (SELECT 1 FROM profile_metrics pm
                            WHERE pm.metrics_date = d.local_date AND pm.version = $1 AND pm.user_id = u.id OFFSET 0)
            AND NOT EXISTS (SELECT 1 FROM metrics_skips ms
                            WHERE ms.user_id = u.id AND ms.version = $1 AND ms.metrics_date = d.local_date
                              AND (s.updated_at IS NULL OR ms.recorded_at >= s.updated_at)))
        """

    private func triggerOnce(version: Int, requestedBy: String) async throws -> TriggerOutcome {
        let chunkSize = String(self.chunkSize)
        let inserted = try await self.pool.withConnection(
            retryOnConnectionLoss: true, deadline: self.pool.requestDeadline
        ) { connection in
            try connection.transaction { connection -> Inserted in
                let inserted = try connection.query(
                    """
                    WITH work AS (SELECT \(Self.needsWork) AS needed),
                    inserted AS (
                      INSERT INTO recompute_jobs (version, users_total, requested_by, created_at)
                      SELECT $1, (SELECT count(*) FROM users), $2, now() WHERE (SELECT needed FROM work)
                      ON CONFLICT (version) WHERE state IN ('pending', 'running') DO NOTHING
                      RETURNING id
                    )
                    SELECT (SELECT id FROM inserted), (SELECT needed FROM work)
                    """, [String(version), requestedBy])
                guard let id = try inserted.optionalInt(0, 0) else {
                    let existing = try connection.query(
                        "SELECT id FROM recompute_jobs WHERE version = $1 AND state IN ('pending', 'running')",
                        [String(version)])
                    if existing.rowCount == 1 { return .active(try existing.int(0, 0)) }
                    // No work: answer with the newest finished job of the version (a done one first).
                    guard try inserted.bool(0, 1) else {
                        let latest = try connection.query(
                            """
                            SELECT id FROM recompute_jobs WHERE version = $1 AND state IN ('done', 'cancelled', 'failed')
                            ORDER BY state = 'done' DESC, id DESC LIMIT 1
                            """, [String(version)])
                        return .nothingToDo(latest.rowCount == 1 ? try latest.int(0, 0) : nil)
                    }
                    // The active job finished between the two statements: try again (next time the insert wins).
                    throw RetryTrigger()
                }
                try connection.query(
                    """
                    WITH numbered AS (
                      SELECT id, row_number() OVER (ORDER BY id) AS n, count(*) OVER () AS total FROM users
                    ),
                    bounds AS (
                      SELECT lag(id, 1, -9223372036854775808) OVER (ORDER BY id) AS lo,
                             CASE WHEN n = total THEN 9223372036854775807 ELSE id END AS hi
                      FROM numbered WHERE n % $3 = 0 OR n = total
                      UNION ALL
                      SELECT -9223372036854775808, 9223372036854775807 WHERE NOT EXISTS (SELECT 1 FROM users)
                    )
                    INSERT INTO work_chunks (kind, priority, version, job_id, range_start, range_end, cursor_user_id,
                                             created_at)
                    SELECT 'recompute', 1, $1, $2, lo, hi, lo, now() FROM bounds
                    """, [String(version), String(id), chunkSize])
                try connection.execute("NOTIFY metricsd_work")
                return .created(id)
            }
        }
        switch inserted {
        case .nothingToDo(nil):
            return .nothingToDo(latest: nil)
        case .nothingToDo(let id?):
            return .nothingToDo(latest: try await self.job(id: id))
        case .created(let id):
            guard let job = try await self.job(id: id) else {
                throw PostgresError(code: .unexpectedResult, message: "recompute job \(id) vanished")
            }
            return .created(job)
        case .active(let id):
            guard let job = try await self.job(id: id) else { throw RetryTrigger() }
            // The job may have finished since: then this trigger looks again (a new job, or nothing to do).
            if job.state.isFinished { throw RetryTrigger() }
            return .active(job)
        }
    }

    /// One job with its progress; nil when there is no such job.
    public func job(id: Int64) async throws -> RecomputeJob? {
        try await self.jobs(where: "j.id = $1", [String(id)]).first
    }

    /// The most recent jobs, newest first.
    public func recent(limit: Int = 20) async throws -> [RecomputeJob] {
        try await self.jobs(where: "true", [], limit: limit)
    }

    /// The newest pending or running job, if any.
    public func active() async throws -> [RecomputeJob] {
        try await self.jobs(where: "j.state IN ('pending', 'running')", [])
    }

    public enum CancelOutcome: Sendable, Hashable {
        case cancelled(RecomputeJob)
        case alreadyFinished(RecomputeJob)
        case notFound
    }

    /// Stops a job: its pending chunks are not claimed any more, and a worker holding one stops at its next
    /// batch (the fence sees the state change). Users already done stay done; triggering again continues.
    public func cancel(id: Int64) async throws -> CancelOutcome {
        let changed = try await self.pool.withConnection(
            retryOnConnectionLoss: true, deadline: self.pool.requestDeadline
        ) { connection in
            try connection.query(
                """
                WITH job AS (
                  UPDATE recompute_jobs SET state = 'cancelled', finished_at = now()
                  WHERE id = $1 AND state IN ('pending', 'running') RETURNING id
                ),
                chunks AS (
                  UPDATE work_chunks SET state = 'cancelled', finished_at = now()
                  WHERE job_id IN (SELECT id FROM job) AND state IN ('pending', 'running') RETURNING 1
                )
                SELECT count(*) FROM job
                """, [String(id)]
            ).int(0, 0)
        }
        guard let job = try await self.job(id: id) else { return .notFound }
        return changed == 1 ? .cancelled(job) : .alreadyFinished(job)
    }

    private func jobs(where condition: String, _ parameters: [String?], limit: Int = 20) async throws -> [RecomputeJob]
    {
        try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: self.pool.requestDeadline) {
            connection in
            let result = try connection.query(
                """
                SELECT j.id, j.version, j.state, j.users_total,
                       coalesce(sum(c.users_done), 0), coalesce(sum(c.users_skipped), 0),
                       (extract(epoch FROM j.created_at) * 1000)::bigint,
                       (extract(epoch FROM j.started_at) * 1000)::bigint,
                       (extract(epoch FROM j.finished_at) * 1000)::bigint,
                       coalesce(j.last_error, (SELECT c2.last_error FROM work_chunks c2
                                               WHERE c2.job_id = j.id AND c2.last_error IS NOT NULL
                                               ORDER BY c2.id DESC LIMIT 1)),
                       extract(epoch FROM coalesce(j.finished_at, now()) - j.started_at)::float8,
                       coalesce(sum(c.users_written), 0)
                FROM recompute_jobs j LEFT JOIN work_chunks c ON c.job_id = j.id
                WHERE \(condition)
                GROUP BY j.id ORDER BY j.id DESC LIMIT $\(parameters.count + 1)
                """, parameters + [String(max(1, limit))])
            return try (0..<result.rowCount).map { row in
                RecomputeJob(
                    id: try result.int(row, 0), version: Int(try result.int(row, 1)),
                    state: RecomputeJob.State(rawValue: try result.requiredString(row, 2)) ?? .failed,
                    counts: WorkCounts(
                        total: try result.int(row, 3), done: try result.int(row, 4), written: try result.int(row, 11),
                        skipped: try result.int(row, 5)),
                    createdAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 6)),
                    startedAt: try result.optionalInt(row, 7).map { Timestamp(millisecondsSinceEpoch: $0) },
                    finishedAt: try result.optionalInt(row, 8).map { Timestamp(millisecondsSinceEpoch: $0) },
                    lastError: result.string(row, 9),
                    elapsedSeconds: result.string(row, 10).flatMap(Double.init))
            }
        }
    }
}
