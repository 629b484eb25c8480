import HealthMetrics
import MetricsdPostgres

/// Where retention stands (`metricsd status`, `/metrics`): the latest run and how far removal is behind.
public struct RetentionStatus: Sendable, Equatable {
    /// The latest retention run, if any.
    public struct Run: Sendable, Equatable {
        public let id: Int64
        public let state: String
        public let cutoff: Timestamp
        public let fullPass: Bool
        public let datesDone: Int
        public let dates: Int
        public let removed: Int64
        public let createdAt: Timestamp
        public let finishedAt: Timestamp?
    }

    public let latest: Run?
    /// Seconds between the cutoff the setting asks for now and the cutoff of the last finished run (before any,
    /// the oldest date in the table): how long rows have been due for removal at most. 0 when caught up.
    public let behindSeconds: Double
}

extension StatusQueries {
    /// Where retention stands for a setting of `days` (`SQL.retentionStatus`).
    public func retention(days: Int, now: Timestamp? = nil) async throws -> RetentionStatus {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared("retention_status", SQL.retentionStatus, [now?.iso8601, String(days)])
            let behind = result.string(0, 9).flatMap(Double.init) ?? 0
            guard let id = try result.optionalInt(0, 0) else {
                return RetentionStatus(latest: nil, behindSeconds: behind)
            }
            let run = RetentionStatus.Run(
                id: id, state: try result.requiredString(0, 1),
                cutoff: Timestamp(millisecondsSinceEpoch: try result.int(0, 2)), fullPass: try result.bool(0, 3),
                datesDone: Int(try result.int(0, 4)), dates: Int(try result.int(0, 5)), removed: try result.int(0, 6),
                createdAt: Timestamp(millisecondsSinceEpoch: try result.int(0, 7)),
                finishedAt: try result.optionalInt(0, 8).map(Timestamp.init(millisecondsSinceEpoch:)))
            return RetentionStatus(latest: run, behindSeconds: behind)
        }
    }
}
