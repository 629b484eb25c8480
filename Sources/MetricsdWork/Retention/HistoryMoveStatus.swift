import HealthMetrics
import MetricsdPostgres

/// Where the move of the old partition's history into monthly partitions stands (`metricsd status`, `/metrics`).
public struct HistoryMoveStatus: Sendable, Equatable {
    public enum State: String, Sendable {
        /// Months being copied from the old partition.
        case copying
        /// Every month copied; their indexes being built.
        case indexing
        /// The months attached in place of the old partition, which is being dropped.
        case swapped
        /// Done: the old partition is gone.
        case done
    }

    /// The old partition.
    public let source: String
    public let state: State
    public let months: Int
    public let monthsCopied: Int
    public let monthsReady: Int
    public let rowsCopied: Int64
    /// The old partition's rows when the move began, as its statistics said.
    public let rowsEstimate: Int64
    /// Writes to the old partition's rows since the copy began that are not replayed into the months yet.
    public let logEntries: Int64
    public let createdAt: Timestamp
    /// How long the swap held its exclusive locks on profile_metrics and users, once it has run.
    public let swapLockMilliseconds: Double?
    public let finishedAt: Timestamp?

    /// Copied rows as a share of the estimate, at most 1.
    public var copiedFraction: Double {
        guard self.rowsEstimate > 0 else { return self.monthsCopied == self.months ? 1 : 0 }
        return min(1, Double(self.rowsCopied) / Double(self.rowsEstimate))
    }
}

extension StatusQueries {
    /// The history move, or nil when there was never one (the history was in monthly partitions from the start, or
    /// the old partition held no row).
    public func historyMove() async throws -> HistoryMoveStatus? {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared(
                "history_move_status",
                """
                SELECT h.source, h.state, count(m.*), count(*) FILTER (WHERE m.copied), count(*) FILTER (WHERE m.ready),
                       coalesce(sum(m.rows_copied), 0), h.rows_estimate,
                       CASE WHEN h.state IN ('copying', 'indexing') THEN (SELECT count(*) FROM history_move_log) ELSE 0 END,
                       (extract(epoch FROM h.created_at) * 1000)::bigint, h.swap_lock_ms::text,
                       (extract(epoch FROM h.finished_at) * 1000)::bigint
                FROM history_move h LEFT JOIN history_move_months m ON true
                GROUP BY h.source, h.state, h.rows_estimate, h.created_at, h.swap_lock_ms, h.finished_at
                """)
            guard result.rowCount == 1 else { return nil }
            let stateText = try result.requiredString(0, 1)
            guard let state = HistoryMoveStatus.State(rawValue: stateText) else {
                throw PostgresError(code: .unexpectedResult, message: "history_move.state is \(stateText)")
            }
            return HistoryMoveStatus(
                source: try result.requiredString(0, 0), state: state, months: Int(try result.int(0, 2)),
                monthsCopied: Int(try result.int(0, 3)), monthsReady: Int(try result.int(0, 4)),
                rowsCopied: try result.int(0, 5), rowsEstimate: try result.int(0, 6), logEntries: try result.int(0, 7),
                createdAt: Timestamp(millisecondsSinceEpoch: try result.int(0, 8)),
                swapLockMilliseconds: result.string(0, 9).flatMap(Double.init),
                finishedAt: try result.optionalInt(0, 10).map(Timestamp.init(millisecondsSinceEpoch:)))
        }
    }
}
