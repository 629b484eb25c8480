import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdWork

/// The HTTP API's store over libpq: the latest-metrics read path, on-demand computation and acknowledgements.
public final class PostgresStore: MetricsStore {
    public let pool: PostgresPool
    public let formula: MetricsFormula
    private let migrator: Migrator
    private let logger: Logger
    /// The batched latest-metrics reads: a service that must run (in the daemon's group, or beside a test) for
    /// `latestMetrics` to answer.
    package let readBatches: LatestMetricsBatcher

    /// - Parameters:
    ///   - readRunners: how many batched latest-metrics reads run at once; default half the pool.
    ///   - replicas: read servers for the latest read (`METRICSD_READ_DATABASE_URL`); nil reads on `pool`.
    public init(
        pool: PostgresPool, formula: MetricsFormula, migrator: Migrator = Migrator(), readRunners: Int? = nil,
        replicas: ReadReplicas? = nil, logger: Logger
    ) {
        self.pool = pool
        self.formula = formula
        self.migrator = migrator
        self.logger = logger
        self.readBatches = LatestMetricsBatcher(
            pool: pool, replicas: replicas, maxRunners: readRunners ?? max(1, pool.configuration.size / 2))
    }

    /// Concurrent reads are coalesced into one statement per batch (`LatestMetricsBatcher`).
    public func latestMetrics(userID: Int64) async throws -> LatestMetrics? {
        try await self.readBatches.load(userID: userID)
    }

    public func latestMetrics(
        userID: Int64, completion: @escaping @Sendable (Result<LatestMetrics?, any Error>) -> Void
    ) {
        self.readBatches.load(userID: userID, completion: completion)
    }

    public func computeNow(userID: Int64) async throws -> ComputeNowOutcome {
        let formula = self.formula
        return try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: self.pool.requestDeadline) {
            connection in
            let rows = try UserRow.decode(
                connection.prepared("read_users_by_id", SQL.readUsersByID, [nil, nil, "{\(userID)}"]))
            guard let row = rows.first else { return .unknownUser }
            let batch = EvaluatedBatch([row], formula: formula)
            try BatchWriter.write(batch, conflict: .refreshIfStale, source: "request", formula: formula, on: connection)
            if let reasons = batch.skipReasons[userID] { return .skipped(reasons) }
            guard let latest = try Self.readLatest(userID: userID, on: connection) else {
                throw PostgresError(
                    code: .unexpectedResult, message: "metrics of user \(userID) vanished after being stored")
            }
            return .computed(latest)
        }
    }

    public func acknowledge(userID: Int64, version: Int, computedAt: Timestamp) async throws -> AcknowledgeOutcome {
        let formula = self.formula
        return try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: self.pool.requestDeadline) {
            connection in
            // Two concurrent first acknowledgements: the loser's statement can neither insert nor see the
            // winner's row in its snapshot; a second run sees it.
            for _ in 0..<2 {
                let result = try connection.prepared(
                    "acknowledge", SQL.acknowledge,
                    [String(userID), String(version), String(computedAt.millisecondsSinceEpoch)])
                guard try result.bool(0, 0) else {
                    return .noMetrics(try Self.whyNoMetrics(userID: userID, formula: formula, on: connection))
                }
                guard try result.bool(0, 1) else { return .notCurrent }
                if let at = try result.optionalInt(0, 2) {
                    return .acknowledged(at: Timestamp(millisecondsSinceEpoch: at), version: version)
                }
            }
            throw PostgresError(code: .unexpectedResult, message: "acknowledgement of user \(userID) was not recorded")
        }
    }

    /// Why a user has no metrics row: unknown, invalid settings (every reason), or valid but not computed yet.
    /// Reads only; writes nothing.
    static func whyNoMetrics(userID: Int64, formula: MetricsFormula, on connection: PostgresConnection) throws
        -> NoMetricsReason
    {
        let rows = try UserRow.decode(
            connection.prepared("read_users_by_id", SQL.readUsersByID, [nil, nil, "{\(userID)}"]))
        guard let row = rows.first else { return .unknownUser }
        let batch = EvaluatedBatch([row], formula: formula)
        if let reasons = batch.skipReasons[userID] { return .invalidSettings(reasons) }
        return .notComputedYet
    }

    /// How long `/readyz` waits for the database: a free connection, opening one, and its probe transaction's commit.
    static let readinessWriteSeconds = 3.0

    public func readiness() async -> Readiness {
        let migrator = self.migrator
        let deadline = ContinuousClock.now + .nanoseconds(Int64(Self.readinessWriteSeconds * 1e9))
        do {
            let pending = try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: deadline) {
                connection in
                // Ready means writes complete: one transaction that writes WAL (a transactional logical-decoding
                // message, no table touched) must commit within a few seconds. It would not on a read-only server
                // (refused on connect anyway), nor when every COMMIT waits for a synchronous standby that is not
                // there (a promoted standby that kept synchronous_standby_names): then 503 "database not
                // answering" instead of a false 200. (`txid_current()` alone writes no WAL and never waits.)
                let deadline = connection.statementDeadlineSeconds
                connection.statementDeadlineSeconds = min(
                    deadline ?? Self.readinessWriteSeconds, Self.readinessWriteSeconds)
                defer { connection.statementDeadlineSeconds = deadline }
                try connection.query("SELECT pg_logical_emit_message(true, 'metricsd', 'readyz')")
                return try migrator.pending(on: connection)
            }
            if pending.isEmpty { return Readiness(database: .ok, schema: .current, reason: nil) }
            return Readiness(
                database: .ok, schema: .behind,
                reason: Self.describe(SchemaStatus(pending: pending, unknown: [], changed: [], latestApplied: nil)))
        } catch let error as PostgresError {
            return Readiness(database: .unreachable, schema: .unknown, reason: "database unreachable: \(error.summary)")
        } catch {
            return Readiness(database: .unreachable, schema: .unknown, reason: "database unreachable")
        }
    }

    /// One line for an operator: what is wrong with the schema.
    public static func describe(_ status: SchemaStatus) -> String {
        if !status.changed.isEmpty {
            return "applied migrations were changed since: \(status.changed.joined(separator: ", "))"
        }
        if !status.pending.isEmpty {
            return
                "schema is behind: \(status.pending.count) pending migration(s) (\(status.pending.joined(separator: ", "))); run `metricsd migrate` or start with --migrate"
        }
        return "schema is current"
    }

    static func readLatest(userID: Int64, on connection: PostgresConnection) throws -> LatestMetrics? {
        let result = try connection.prepared("latest_metrics", SQL.latestMetrics, [String(userID)])
        guard result.rowCount == 1 else { return nil }
        return try Self.decodeLatest(result, row: 0, column: 0, userID: userID)
    }

    /// The latest metrics of each of `userIDs` that has any, in one statement.
    static func readLatest(userIDs: [Int64], on connection: PostgresConnection) throws -> [Int64: LatestMetrics] {
        if userIDs.count == 1 {
            return try Self.readLatest(userID: userIDs[0], on: connection).map { [userIDs[0]: $0] } ?? [:]
        }
        let array = "{" + userIDs.map(String.init).joined(separator: ",") + "}"
        let result = try connection.prepared("latest_metrics_batch", SQL.latestMetricsBatch, [array])
        var found: [Int64: LatestMetrics] = [:]
        found.reserveCapacity(result.rowCount)
        for row in 0..<result.rowCount {
            let userID = try result.int(row, 0)
            found[userID] = try Self.decodeLatest(result, row: row, column: 1, userID: userID)
        }
        return found
    }

    /// One row of `latestMetrics` (or of `latestMetricsBatch` from column 1).
    private static func decodeLatest(_ result: PostgresResult, row: Int, column: Int, userID: Int64) throws
        -> LatestMetrics
    {
        let bmiText = try result.requiredString(row, column)
        guard let bmi = FixedPoint(parsing: bmiText, scale: 1) else {
            throw PostgresError(code: .unexpectedResult, message: "bmi \(bmiText) of user \(userID) is not a number")
        }
        let metrics = ComputedMetrics(
            bmiTenths: bmi.units, bmr: try result.int(row, column + 1), tdee: try result.int(row, column + 2),
            version: Int(try result.int(row, column + 3)))
        return LatestMetrics(
            metrics: metrics,
            computedAt: Timestamp(millisecondsSinceEpoch: try result.int(row, column + 4)),
            acknowledgedAt: try result.optionalInt(row, column + 5).map { Timestamp(millisecondsSinceEpoch: $0) },
            invalidSettings: result.string(row, column + 6))
    }
}
