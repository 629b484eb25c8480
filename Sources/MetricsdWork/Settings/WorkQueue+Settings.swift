import MetricsdPostgres
import HealthMetrics

extension WorkQueue {
    // MARK: Settings changes

    /// Recomputes the given users' rows for their current local date (settings changed): a row computed before
    /// the change is refreshed and its `computed_at` moves forward; invalid users get a skip record. Writes
    /// nothing when the schema is newer than this build (`newestMigration`).
    /// - Returns: rows written.
    @discardableResult
    public func refreshUsers(_ ids: [Int64], now: Timestamp? = nil) async throws -> Int {
        guard !ids.isEmpty else { return 0 }
        let formula = self.formula
        let literal = "{" + ids.map(String.init).joined(separator: ",") + "}"
        return try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let newer = try connection.prepared(
                "newer_schema", "SELECT \(SQL.newerSchema("$1"))", [Self.newestMigration])
            if try newer.bool(0, 0) { return 0 }
            let rows = try UserRow.decode(
                connection.prepared("read_users_by_id", SQL.readUsersByID, [now?.iso8601, nil, literal]))
            let batch = EvaluatedBatch(rows, formula: formula)
            return try BatchWriter.write(
                batch, conflict: .refreshIfStale, source: "settings", now: now, formula: formula, on: connection
            ).written
        }
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
                "stale_settings",
                """
                SELECT s.user_id, s.updated_at::text FROM user_settings s
                WHERE s.updated_at > $1::timestamptz - make_interval(mins => $4)
                  AND NOT EXISTS (SELECT 1 FROM profile_metrics pm
                                  WHERE pm.user_id = s.user_id AND pm.version = $2 AND pm.computed_at > s.updated_at)
                  AND NOT EXISTS (SELECT 1 FROM metrics_skips k
                                  WHERE k.user_id = s.user_id AND k.recorded_at > s.updated_at)
                ORDER BY s.updated_at LIMIT $3
                """, [since, version, String(limit), String(overlapMinutes)])
            let ids = try (0..<result.rowCount).map { try result.int($0, 0) }
            if ids.count >= limit { return (ids, result.string(result.rowCount - 1, 1)) }
            return (ids, try connection.query("SELECT now()::text").requiredString(0, 0))
        }
    }
}
