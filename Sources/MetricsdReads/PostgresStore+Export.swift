import HealthMetrics
import MetricsdPostgres
import MetricsdWork

extension SQL {
    // MARK: Export

    /// What an export shows besides the rows: the user, the settings as stored now (values as text), the skip
    /// record's reasons and the acknowledgement. No row: no such user. `$1` user id.
    static let exportProfile = """
        SELECT u.timezone, s.user_id IS NOT NULL, s.date_of_birth::text, s.gender, s.current_weight::text, s.height::text,
               s.activity_level, coalesce(s.onboarding_completed, false),
               (extract(epoch FROM s.updated_at) * 1000)::bigint, sk.reasons, a.version,
               (extract(epoch FROM a.metrics_computed_at) * 1000)::bigint,
               (extract(epoch FROM a.acknowledged_at) * 1000)::bigint
        FROM users u
        LEFT JOIN user_settings s ON s.user_id = u.id
        LEFT JOIN metrics_skips sk ON sk.user_id = u.id
        LEFT JOIN metrics_acknowledgements a ON a.user_id = u.id
        WHERE u.id = $1
        """

    /// One page of the user's rows of every version, by version then date, after (`$2`, `$3`), at most `$4`, in
    /// the columns of `historyRange` plus the version. Each partition's rows of the user come from the read index.
    static let exportRows = """
        SELECT pm.metrics_date::text, pm.bmi::text, pm.bmr, pm.tdee,
               (extract(epoch FROM pm.computed_at) * 1000)::bigint,
               (extract(epoch FROM a.acknowledged_at) * 1000)::bigint, pm.version
        FROM profile_metrics pm
        LEFT JOIN metrics_acknowledgements a
          ON a.user_id = $1 AND a.version = pm.version AND a.metrics_computed_at = pm.computed_at
        WHERE pm.user_id = $1 AND (pm.version, pm.metrics_date) > ($2::int, $3::date)
        ORDER BY pm.version, pm.metrics_date
        LIMIT $4
        """
}

extension PostgresStore: MetricsExportStore {
    public func exportProfile(userID: Int64) async throws -> ExportProfile? {
        try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: self.pool.requestDeadline) {
            connection in
            let result = try connection.prepared("export_profile", SQL.exportProfile, [String(userID)])
            guard result.rowCount == 1 else { return nil }
            let acknowledgement = try result.optionalInt(0, 10).map { version in
                (
                    version: Int(version), computedAt: Timestamp(millisecondsSinceEpoch: try result.int(0, 11)),
                    acknowledgedAt: Timestamp(millisecondsSinceEpoch: try result.int(0, 12))
                )
            }
            return ExportProfile(
                userID: userID, timezone: try result.requiredString(0, 0), hasSettings: try result.bool(0, 1),
                dateOfBirth: result.string(0, 2), gender: result.string(0, 3), weightKilograms: result.string(0, 4),
                heightCentimetres: result.string(0, 5), activityLevel: result.string(0, 6),
                onboardingCompleted: try result.bool(0, 7),
                settingsUpdatedAt: try result.optionalInt(0, 8).map { Timestamp(millisecondsSinceEpoch: $0) },
                invalidSettings: result.string(0, 9), acknowledgement: acknowledgement)
        }
    }

    public func exportRows(userID: Int64, after: (version: Int, date: LocalDate)?, limit: Int) async throws
        -> [HistoryEntry]
    {
        try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: self.pool.requestDeadline) {
            connection in
            let result = try connection.prepared(
                "export_rows", SQL.exportRows,
                [String(userID), String(after?.version ?? 0), after?.date.description ?? "0001-01-01", String(limit)])
            return try (0..<result.rowCount).map { row in
                try Self.decodeHistory(result, row: row, version: Int(try result.int(row, 6)), userID: userID)
            }
        }
    }
}
