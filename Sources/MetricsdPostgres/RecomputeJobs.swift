import HealthMetrics

/// A recompute-all job and its progress, as `GET /v1/admin/recompute/{id}` and `metricsd recompute-status` show it.
public struct RecomputeJob: Sendable, Hashable {
    public enum State: String, Sendable {
        case pending, running, done, cancelled, failed
        public var isFinished: Bool { self == .done || self == .cancelled || self == .failed }
    }
    public let id: Int64
    public let version: Int
    public let state: State
    /// Users when the job was created.
    public let usersTotal: Int64
    /// Users who have the new version's row for their current date (written now or already there).
    public let usersDone: Int64
    /// Users skipped with a reason.
    public let usersSkipped: Int64
    public let createdAt: Timestamp
    public let startedAt: Timestamp?
    public let finishedAt: Timestamp?
    public let lastError: String?
    /// Seconds between start and finish (or now).
    public let elapsedSeconds: Double?

    /// Percent of users processed (done or skipped), 0–100.
    public var percent: Double {
        guard self.usersTotal > 0 else { return self.state == .done ? 100 : 0 }
        return min(100, Double(self.usersDone + self.usersSkipped) * 100 / Double(self.usersTotal))
    }

    /// Users processed per second since the job started.
    public var ratePerSecond: Double? {
        guard let elapsed = self.elapsedSeconds, elapsed > 0, self.startedAt != nil else { return nil }
        return Double(self.usersDone + self.usersSkipped) / elapsed
    }

    /// Seconds left at the current rate; nil when finished or not started.
    public var etaSeconds: Double? {
        guard !self.state.isFinished, let rate = self.ratePerSecond, rate > 0 else { return nil }
        return max(0, Double(self.usersTotal - self.usersDone - self.usersSkipped) / rate)
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

    /// Creates the job for `version`, split into user-id ranges of about `chunkSize` users, unless one is
    /// pending or running: then that one is returned (`created` false).
    public func trigger(version: Int, requestedBy: String) async throws -> (job: RecomputeJob, created: Bool) {
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

    private func triggerOnce(version: Int, requestedBy: String) async throws -> (job: RecomputeJob, created: Bool) {
        let chunkSize = String(self.chunkSize)
        let (id, created) = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.transaction { connection -> (Int64, Bool) in
                let inserted = try connection.query(
                    """
                    INSERT INTO recompute_jobs (version, users_total, requested_by, created_at)
                    VALUES ($1, (SELECT count(*) FROM users), $2, now())
                    ON CONFLICT (version) WHERE state IN ('pending', 'running') DO NOTHING
                    RETURNING id
                    """, [String(version), requestedBy])
                guard inserted.rowCount == 1 else {
                    let existing = try connection.query(
                        "SELECT id FROM recompute_jobs WHERE version = $1 AND state IN ('pending', 'running')",
                        [String(version)])
                    // The active job finished between the two statements: try again (next time the insert wins).
                    guard existing.rowCount == 1 else { throw RetryTrigger() }
                    return (try existing.int(0, 0), false)
                }
                let id = try inserted.int(0, 0)
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
                return (id, true)
            }
        }
        guard let job = try await self.job(id: id) else {
            throw PostgresError(code: .unexpectedResult, message: "recompute job \(id) vanished")
        }
        // An existing job may have finished since: then this trigger starts the next one.
        if !created && job.state.isFinished { throw RetryTrigger() }
        return (job, created)
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
        let changed = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
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

    private func jobs(where condition: String, _ parameters: [String?], limit: Int = 20) async throws -> [RecomputeJob] {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
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
                       extract(epoch FROM coalesce(j.finished_at, now()) - j.started_at)::float8
                FROM recompute_jobs j LEFT JOIN work_chunks c ON c.job_id = j.id
                WHERE \(condition)
                GROUP BY j.id ORDER BY j.id DESC LIMIT $\(parameters.count + 1)
                """, parameters + [String(max(1, limit))])
            return try (0..<result.rowCount).map { row in
                RecomputeJob(
                    id: try result.int(row, 0), version: Int(try result.int(row, 1)),
                    state: RecomputeJob.State(rawValue: try result.requiredString(row, 2)) ?? .failed,
                    usersTotal: try result.int(row, 3), usersDone: try result.int(row, 4),
                    usersSkipped: try result.int(row, 5),
                    createdAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 6)),
                    startedAt: try result.optionalInt(row, 7).map { Timestamp(millisecondsSinceEpoch: $0) },
                    finishedAt: try result.optionalInt(row, 8).map { Timestamp(millisecondsSinceEpoch: $0) },
                    lastError: result.string(row, 9),
                    elapsedSeconds: result.string(row, 10).flatMap(Double.init))
            }
        }
    }
}
