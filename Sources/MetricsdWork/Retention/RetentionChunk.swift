import HealthMetrics
import MetricsdPostgres

/// A retention chunk this worker holds: the rows of one `metrics_date` that its run may remove.
public struct RetentionChunk: Sendable, Hashable {
    public let id: Int64
    /// The retention run (`retention_runs.id`) the chunk belongs to.
    public let runID: Int64
    /// The `metrics_date` whose rows the chunk examines.
    public let date: LocalDate
    /// The last user of that date examined before this claim (resume point).
    public let cursor: Int64
    public let attempts: Int
    /// The instance whose lease on this chunk had expired while it was running, when that was another instance.
    public let takenOverFrom: String?

    init(_ result: PostgresResult, row: Int) throws(PostgresError) {
        self.id = try result.int(row, 0)
        let dateText = try result.requiredString(row, 3)
        guard let date = LocalDate(iso: dateText) else {
            throw PostgresError(code: .unexpectedResult, message: "retention chunk date \(dateText) is not a date")
        }
        self.date = date
        self.cursor = try result.int(row, 8)
        self.attempts = Int(try result.int(row, 9))
        self.takenOverFrom = result.string(row, 10)
        self.runID = try result.int(row, 11)
    }
}
