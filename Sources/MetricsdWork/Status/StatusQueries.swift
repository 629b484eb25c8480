import HealthMetrics
import MetricsdPostgres

/// What an operator asks at 00:30, answered from the database alone (`metricsd status`, `/metrics` gauges).
public struct StatusQueries: Sendable {
    public let pool: PostgresPool

    public init(pool: PostgresPool) {
        self.pool = pool
    }

    /// Today's daily work at a glance, cheap enough for every scheduler tick.
    public struct Overview: Sendable, Equatable {
        /// Seconds since the oldest zone's daily time passed without its unit being done; 0 when all are.
        public var oldestOverdueSeconds: Double
        public var unitsDone: Int
        public var unitsRunning: Int
        public var unitsPending: Int
        /// Zones due whose unit no instance has created yet.
        public var unitsMissing: Int
        /// Users past their zone's due instant who have neither a row nor a skip verdict for that date yet: the
        /// users of zones whose unit is missing, plus those of unfinished units not examined yet.
        public var usersWaiting: Int = 0
        /// The UTC offsets, in seconds, of the known zones in use at their current due instants.
        public var utcOffsets: [Int] = []
    }

    public func overview(dailyAt: DailyTime, version: Int, now: Timestamp? = nil) async throws -> Overview {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared(
                "status_overview",
                """
                WITH \(SQL.zoneScheduleCTE), \(SQL.dueInstantCTE)
                SELECT coalesce(extract(epoch FROM max((SELECT now FROM clock) - da.due_at)
                                  FILTER (WHERE u.state IS DISTINCT FROM 'done')), 0)::float8,
                       count(*) FILTER (WHERE u.state = 'done'),
                       count(*) FILTER (WHERE u.state = 'running'),
                       count(*) FILTER (WHERE u.state = 'pending'),
                       count(*) FILTER (WHERE u.state IS NULL OR u.state = 'superseded'),
                       coalesce(sum(CASE
                         WHEN u.state = 'done' THEN 0
                         WHEN u.state IN ('pending', 'running') THEN greatest(0, u.users_total - coalesce((
                           SELECT sum(c.users_done + c.users_skipped) FROM work_chunks c
                           WHERE c.kind = 'daily' AND c.timezone = u.timezone AND c.local_date = u.local_date
                             AND c.version = u.version), 0))
                         ELSE (SELECT count(*) FROM users x WHERE x.timezone = da.timezone)
                       END), 0),
                       coalesce(array_to_string(array_agg(DISTINCT
                         CASE WHEN da.known THEN extract(epoch FROM (da.due_at AT TIME ZONE da.timezone)
                                                             - (da.due_at AT TIME ZONE 'UTC'))::int END)
                         FILTER (WHERE da.known), ','), '')
                FROM due_at da
                LEFT JOIN daily_units u ON u.timezone = da.timezone AND u.local_date = da.due_date AND u.version = $3
                """, [now?.iso8601, dailyAt.description, String(version)])
            return Overview(
                oldestOverdueSeconds: max(0, Double(try result.requiredString(0, 0)) ?? 0),
                unitsDone: Int(try result.int(0, 1)), unitsRunning: Int(try result.int(0, 2)),
                unitsPending: Int(try result.int(0, 3)), unitsMissing: Int(try result.int(0, 4)),
                usersWaiting: Int(try result.int(0, 5)),
                utcOffsets: (result.string(0, 6) ?? "").split(separator: ",").compactMap { Int($0) })
        }
    }

    /// One zone's unit for its current due date.
    public struct ZoneStatus: Sendable, Equatable {
        public enum State: String, Sendable {
            case done, running, pending, overdue, missing
        }
        public let timezone: String
        public let known: Bool
        public let dueDate: LocalDate
        public let dueAt: Timestamp
        public let state: State
        public let usersTotal: Int
        public let usersDone: Int
        public let usersSkipped: Int
        /// Instances holding a live lease on one of its chunks.
        public let runningBy: [String]
        /// Seconds since it fell due while not done; 0 when done.
        public let overdueSeconds: Double
        /// For a done unit: seconds from its due instant to its end (how late its last users' rows came).
        public var finishedLateSeconds: Double? = nil
    }

    /// Every zone in use, with its current unit. A unit not done and not progressing under a live lease
    /// `overdueAfter` seconds after it fell due is overdue (pending, abandoned by a dead worker, or never created).
    public func zones(dailyAt: DailyTime, version: Int, overdueAfter: Double = 600, now: Timestamp? = nil)
        async throws -> [ZoneStatus]
    {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.query(
                """
                WITH \(SQL.zoneScheduleCTE), \(SQL.dueInstantCTE)
                SELECT da.timezone, da.known, da.due_date::text, (extract(epoch FROM da.due_at) * 1000)::bigint,
                       u.state, coalesce(u.users_total, 0), coalesce(sum(c.users_done), 0),
                       coalesce(sum(c.users_skipped), 0),
                       coalesce(array_to_string(array_agg(DISTINCT c.lease_owner)
                         FILTER (WHERE c.state = 'running' AND c.lease_until > (SELECT now FROM clock)), ','), ''),
                       extract(epoch FROM (SELECT now FROM clock) - da.due_at)::float8,
                       extract(epoch FROM u.finished_at - da.due_at)::float8
                FROM due_at da
                LEFT JOIN daily_units u ON u.timezone = da.timezone AND u.local_date = da.due_date AND u.version = $3
                LEFT JOIN work_chunks c ON c.kind = 'daily' AND c.timezone = u.timezone AND c.local_date = u.local_date
                                       AND c.version = u.version
                GROUP BY da.timezone, da.known, da.due_date, da.due_at, u.state, u.users_total, u.finished_at
                ORDER BY da.timezone
                """, [now?.iso8601, dailyAt.description, String(version)])
            return try (0..<result.rowCount).map { row in
                let dateText = try result.requiredString(row, 2)
                guard let date = LocalDate(iso: dateText) else {
                    throw PostgresError(code: .unexpectedResult, message: "due date \(dateText) is not a date")
                }
                let age = Double(result.string(row, 9) ?? "0") ?? 0
                let runningBy = (result.string(row, 8) ?? "").split(separator: ",").map(String.init)
                let state: ZoneStatus.State
                switch result.string(row, 4) {
                case "done": state = .done
                case "running" where !runningBy.isEmpty: state = .running  // progressing under a live lease
                case _ where age > overdueAfter: state = .overdue
                case "running", "pending": state = .pending
                default: state = .missing
                }
                return ZoneStatus(
                    timezone: try result.requiredString(row, 0), known: try result.bool(row, 1), dueDate: date,
                    dueAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 3)), state: state,
                    usersTotal: Int(try result.int(row, 5)), usersDone: Int(try result.int(row, 6)),
                    usersSkipped: Int(try result.int(row, 7)), runningBy: runningBy,
                    overdueSeconds: state == .done ? 0 : max(0, age),
                    finishedLateSeconds: state == .done ? result.string(row, 10).flatMap(Double.init) : nil)
            }
        }
    }

    /// Skipped users per reason code (a user with two reasons counts under both).
    public func skipsByReason() async throws -> [(reason: String, users: Int)] {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.query(
                "SELECT code, count(*) FROM metrics_skips, unnest(reason_codes) AS code GROUP BY code ORDER BY 2 DESC, 1"
            )
            return try (0..<result.rowCount).map { (try result.requiredString($0, 0), Int(try result.int($0, 1))) }
        }
    }

    /// One skipped user.
    public struct SkippedUser: Sendable, Equatable {
        public let userID: Int64
        public let reasonCodes: [String]
        public let reasons: String
        public let metricsDate: LocalDate?
        public let version: Int
        public let source: String
        public let recordedAt: Timestamp
    }

    /// The most recently recorded skips.
    public func skippedUsers(limit: Int) async throws -> [SkippedUser] {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.query(
                """
                SELECT user_id, array_to_string(reason_codes, ','), reasons, metrics_date::text, version, source,
                       (extract(epoch FROM recorded_at) * 1000)::bigint
                FROM metrics_skips ORDER BY recorded_at DESC, user_id LIMIT $1
                """, [String(max(1, limit))])
            return try (0..<result.rowCount).map { row in
                SkippedUser(
                    userID: try result.int(row, 0),
                    reasonCodes: (result.string(row, 1) ?? "").split(separator: ",").map(String.init),
                    reasons: try result.requiredString(row, 2),
                    metricsDate: result.string(row, 3).flatMap { LocalDate(iso: $0) },
                    version: Int(try result.int(row, 4)), source: try result.requiredString(row, 5),
                    recordedAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 6)))
            }
        }
    }

    /// Users by the formula version of their latest metrics row (nil: no metrics at all). One primary-key probe
    /// per user: seconds on millions of users, meant for `metricsd status`, not for every scrape.
    public func usersByLatestVersion() async throws -> [(version: Int?, users: Int)] {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.query(
                """
                SELECT l.version, count(*) FROM users u
                LEFT JOIN profile_metrics_latest l ON l.user_id = u.id
                GROUP BY l.version ORDER BY l.version NULLS FIRST
                """)
            return try (0..<result.rowCount).map {
                (try result.optionalInt($0, 0).map(Int.init), Int(try result.int($0, 1)))
            }
        }
    }
}
