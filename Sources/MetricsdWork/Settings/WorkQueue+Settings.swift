import HealthMetrics
import MetricsdPostgres
import ServiceLifecycle

extension WorkQueue {
    // MARK: Settings changes

    /// Recomputes the given users' rows for their current local date (settings changed): a row computed before
    /// the change is refreshed and its `computed_at` moves forward; invalid users get a skip record. Writes
    /// nothing when the schema is newer than this build (`newestMigration`).
    ///
    /// One statement per user: a statement refreshing several users' rows held one user's row while it waited for
    /// another's, and a transaction changing the same rows in another order (an operator's bulk delete, another
    /// instance's daily batch) then waited for the first: a deadlock. A statement on one user's rows holds none
    /// of another user's. A stopping daemon stops between users (a sweep after an outage may hold thousands):
    /// those left are still stale, and the next sweep finds them.
    /// - Returns: rows written.
    @discardableResult
    public func refreshUsers(_ ids: [Int64], now: Timestamp? = nil) async throws -> Int {
        guard !ids.isEmpty else { return 0 }
        let formula = self.formula
        let literal = "{" + ids.map(String.init).joined(separator: ",") + "}"
        let rows = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection -> [UserRow] in
            let newer = try connection.prepared(
                "newer_schema", "SELECT \(SQL.newerSchema("$1"))", [Self.newestMigration])
            if try newer.bool(0, 0) { return [] }
            return try UserRow.decode(
                connection.prepared("read_users_by_id", SQL.readUsersByID, [now?.iso8601, nil, literal]))
        }
        var written = 0
        for row in rows {
            if Task.isCancelled || Task.isShuttingDownGracefully { break }
            written += try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
                try BatchWriter.write(
                    EvaluatedBatch([row], formula: formula), conflict: .refreshIfStale, source: "settings", now: now,
                    formula: formula, on: connection
                ).written
            }
        }
        return written
    }

    /// Users whose settings changed after `since - overlapMinutes` and who have neither metrics nor a skip
    /// record newer than the change: the sweep that catches notifications lost while disconnected. The overlap
    /// covers transactions that committed after a later one (`updated_at` is a transaction's start time).
    /// - Returns: the ids (at most `limit`) and the watermark for the next sweep: the newest change returned
    ///   when there may be more, else the database's `now()`.
    public func staleSettings(since: String, overlapMinutes: Int, limit: Int = 5000) async throws
        -> (ids: [Int64], newest: String?)
    {
        let version = String(self.formula.version)
        return try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared(
                "stale_settings", SQL.staleSettings, [since, version, String(limit), String(overlapMinutes)])
            let ids = try (0..<result.rowCount).map { try result.int($0, 0) }
            if ids.count >= limit { return (ids, result.string(result.rowCount - 1, 1)) }
            return (ids, try connection.query("SELECT now()::text").requiredString(0, 0))
        }
    }
}
