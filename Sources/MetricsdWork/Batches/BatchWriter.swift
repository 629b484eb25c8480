import HealthMetrics
import MetricsdPostgres

/// Runs `SQL.writeBatch` for an evaluated batch.
package enum BatchWriter {
    package struct Fence {
        let chunkID: Int64
        let owner: String
        let cursor: Int64
        let leaseSeconds: Double
        let last: Bool
    }

    /// - Returns: (fence held, rows written, skips recorded). Unfenced writes always "hold" the fence.
    @discardableResult
    package static func write(
        _ batch: EvaluatedBatch, conflict: SQL.Conflict, fence: Fence? = nil, source: String, now: Timestamp? = nil,
        formula: MetricsFormula, on connection: PostgresConnection
    ) throws -> (fenced: Bool, written: Int, skipped: Int) {
        let name: String
        switch (conflict, fence != nil) {
        case (.keep, true): name = "write_keep_fenced"
        case (.keep, false): name = "write_keep"
        case (.updateIfChanged, true): name = "write_update_fenced"
        case (.updateIfChanged, false): name = "write_update"
        case (.refreshIfStale, true): name = "write_refresh_fenced"
        case (.refreshIfStale, false): name = "write_refresh"
        }
        var parameters: [String?] = [now?.iso8601]
        parameters += [
            fence.map { String($0.chunkID) }, fence?.owner, fence.map { String($0.cursor) },
            fence.map { _ in String(batch.computedIDs.count) }, fence.map { _ in String(batch.skippedIDs.count) },
            fence.map { String($0.leaseSeconds) }, fence.map { $0.last ? "true" : "false" },
        ]
        parameters += batch.metricsParameters
        parameters += [String(formula.version), batch.skipsParameter, batch.clearedParameter, source]
        let result = try connection.prepared(name, SQL.writeBatch(conflict, fenced: fence != nil), parameters)
        return (try result.int(0, 0) == 1, Int(try result.int(0, 1)), Int(try result.int(0, 2)))
    }
}
