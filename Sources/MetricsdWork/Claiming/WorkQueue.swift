import CoreMetrics
import HealthMetrics
import Logging
import MetricsdPostgres

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Durable, claimable work over PostgreSQL: daily units and recompute jobs, split into chunks of user-id ranges,
/// and retention runs, split into chunks of one `metrics_date` each, that any instance claims with a row lease and
/// works through in keyset batches.
///
/// One mechanism serves every kind: `claimWork` takes the next chunk (daily first, then recompute, then
/// retention), `process` works through it batch by batch, each batch's writes (or removals) and the chunk's cursor
/// and lease renewal in one transaction fenced on the lease. A crash loses at most the uncommitted batch; another
/// instance resumes from the cursor once the lease has expired by the database clock.
public struct WorkQueue: Sendable {
    public struct Configuration: Sendable {
        /// Users per keyset batch (one transaction). Default 1000.
        public var batchSize: Int = 1000
        /// Users per chunk (one claim). Default 5000: small enough that a recompute chunk never delays a daily
        /// unit for long, large enough that claiming costs little.
        public var chunkSize: Int = 5000
        /// How long a claim lasts without renewal; each batch renews it. Default 60 s.
        public var leaseSeconds: Double = 60
        public init() {}
    }

    /// Test hooks: where a worker "crashes" (see `PostgresConnection.simulateCrash`).
    public struct Faults: Sendable {
        /// Called after a batch's statement, before its `COMMIT`.
        public var beforeCommit: (@Sendable (PostgresConnection, ClaimedChunk) throws -> Void)?
        /// Called after a batch's `COMMIT`.
        public var afterCommit: (@Sendable (PostgresConnection, ClaimedChunk) throws -> Void)?
        /// Called after a retention batch's statement, before its `COMMIT`.
        public var retentionBeforeCommit: (@Sendable (PostgresConnection, RetentionChunk) throws -> Void)?
        public init() {}
    }

    public let pool: PostgresPool
    public let formula: MetricsFormula
    public let configuration: Configuration
    /// The lease owner written on claimed chunks: this instance's id.
    public let owner: String
    public var faults = Faults()
    private let logger: Logger

    public init(
        pool: PostgresPool, formula: MetricsFormula, owner: String, configuration: Configuration = .init(),
        logger: Logger
    ) {
        self.pool = pool
        self.formula = formula
        self.owner = owner
        self.configuration = configuration
        self.logger = logger
    }

    // MARK: Scheduling daily units

    /// A daily unit created by `enqueueDueUnits`.
    public struct NewUnit: Sendable, Hashable {
        public let timezone: String
        public let localDate: LocalDate
        public let chunks: Int

        public init(timezone: String, localDate: LocalDate, chunks: Int) {
            self.timezone = timezone
            self.localDate = localDate
            self.chunks = chunks
        }
    }

    /// Refreshes `known_timezones` from the server's `pg_timezone_names` (start-up and hourly).
    public func refreshKnownTimezones() async throws {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.transaction { connection in
                try connection.execute(
                    """
                    INSERT INTO known_timezones (name) SELECT name FROM pg_timezone_names ON CONFLICT DO NOTHING;
                    DELETE FROM known_timezones WHERE name NOT IN (SELECT name FROM pg_timezone_names)
                    """)
            }
        }
    }

    /// Creates the history's monthly partitions that do not exist yet, through two months from now by the database
    /// clock (`metricsd_add_partitions`: safe on every instance at once; a lock it cannot take within two seconds
    /// fails this call, and the next one tries again). Returns how many it created.
    public func addMonthlyPartitions() async throws -> Int {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.transaction { connection in
                Int(
                    try connection.query("SELECT metricsd_add_partitions((now() + interval '2 months')::date)").int(
                        0, 0))
            }
        }
    }

    /// Truncates the history's monthly partitions that retention has emptied: those whose dates all lie more than
    /// `retentionDays` (and a day) back, that hold no row, and whose indexes still take more than their empty size
    /// (`metricsd_truncate_empty_partitions`: a partition busy for more than 100 ms is left to the next call).
    /// Deleted rows leave space that only new rows of the same month would reuse, and VACUUM never shrinks an
    /// index, so without this the history would keep a month of index space for every month it ever held.
    /// `now` replaces the database clock (tests). Returns how many partitions it truncated.
    public func truncateEmptiedPartitions(retentionDays: Int, now: Timestamp? = nil) async throws -> Int {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            // One statement: its own transaction, which the function's lock timeout and advisory lock last for.
            Int(
                try connection.query(
                    """
                    SELECT metricsd_truncate_empty_partitions(
                      (coalesce($2::timestamptz, now()) - make_interval(days => $1::int))::date - 1)
                    """,
                    [String(retentionDays), now?.iso8601]
                ).int(0, 0))
        }
    }

    /// The database server's wall clock, in seconds since 1970, and how far it is ahead of this host's
    /// (negative: behind), measured against the middle of the round trip.
    public func databaseClock() async throws -> (now: Double, offset: Double) {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let before = Date().timeIntervalSince1970
            let result = try connection.query("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
            let after = Date().timeIntervalSince1970
            let now = Double(try result.int(0, 0)) / 1_000_000
            return (now, now - (before + after) / 2)
        }
    }

    /// The newest migration this build knows. When the database has a newer one (a newer metricsd migrated it
    /// during a rolling upgrade), this instance creates no unit, claims no chunk and refreshes no user: it keeps
    /// serving reads, and the newer instances do the work.
    static let newestMigration = Migration.all.map(\.name).max() ?? ""

    /// Creates the unit of every zone whose daily time has passed today by the database clock and has no unit
    /// yet, split into chunks, and supersedes older unfinished units of those zones. Safe to run on every
    /// instance at once: the `(zone, date, version)` key lets exactly one create each unit.
    public func enqueueDueUnits(dailyAt: DailyTime, now: Timestamp? = nil) async throws -> [NewUnit] {
        let parameters = [
            now?.iso8601, dailyAt.description, String(self.formula.version), String(self.configuration.chunkSize),
            Self.newestMigration,
        ]
        return try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            // No JIT for this statement: the planner's estimate (thousands of zones × dates) is high enough that
            // PostgreSQL would JIT-compile it on every tick, costing several times the statement's own work. Set
            // for this transaction only, so it survives a transaction-mode pooler and leaks to no other session.
            try connection.execute("BEGIN; SET LOCAL jit = off")
            let created: PostgresResult
            do {
                created = try connection.prepared("enqueue_due_units", SQL.enqueueDueUnits, parameters)
                try connection.execute("COMMIT")
            } catch {
                if connection.isHealthy { try? connection.execute("ROLLBACK") }
                throw error
            }
            return try (0..<created.rowCount).map { row in
                let date = try created.requiredString(row, 1)
                guard let localDate = LocalDate(iso: date) else {
                    throw PostgresError(code: .unexpectedResult, message: "unit date \(date) is not a date")
                }
                return NewUnit(
                    timezone: try created.requiredString(row, 0), localDate: localDate,
                    chunks: Int(try created.int(row, 2)))
            }
        }
    }

    // MARK: Claiming and processing

    /// Claims the next free chunk of users to compute, daily work first; nil when there is none. (`claimWork`
    /// also takes retention chunks.)
    public func claim(now: Timestamp? = nil) async throws -> ClaimedChunk? {
        guard case .users(let chunk)? = try await self.claimNext(retention: false, now: now) else { return nil }
        return chunk
    }

    /// Claims the next free chunk of any kind: daily, then recompute, then retention work.
    public func claimWork(now: Timestamp? = nil) async throws -> ClaimedWork? {
        try await self.claimNext(retention: true, now: now)
    }

    private func claimNext(retention: Bool, now: Timestamp?) async throws -> ClaimedWork? {
        let owner = self.owner
        let lease = String(self.configuration.leaseSeconds)
        let version = String(self.formula.version)
        return try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared(
                "claim_chunk", SQL.claimChunk,
                [
                    now?.iso8601, owner, lease, version, retention ? "true" : "false",
                    Self.newestMigration,
                ])
            guard result.rowCount == 1 else { return nil }
            if try result.requiredString(0, 1) == "retention" { return .retention(try RetentionChunk(result, row: 0)) }
            return .users(try ClaimedChunk(result, row: 0))
        }
    }

    /// Gives the chunk back at once so a peer can take it over (graceful stop).
    public func release(_ chunk: ClaimedChunk, now: Timestamp? = nil) async throws {
        try await self.release(chunkID: chunk.id, now: now)
    }

    /// Records a failed attempt; the chunk becomes claimable again after a backoff.
    public func fail(_ chunk: ClaimedChunk, error: String, now: Timestamp? = nil) async throws {
        try await self.fail(chunkID: chunk.id, error: error, now: now)
    }

    /// Gives any claimed chunk back at once (graceful stop).
    public func release(_ work: ClaimedWork, now: Timestamp? = nil) async throws {
        try await self.release(chunkID: work.id, now: now)
    }

    /// Records a failed attempt on any claimed chunk.
    public func fail(_ work: ClaimedWork, error: String, now: Timestamp? = nil) async throws {
        try await self.fail(chunkID: work.id, error: error, now: now)
    }

    func release(chunkID: Int64, now: Timestamp?) async throws {
        let owner = self.owner
        _ = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.prepared("release_chunk", SQL.releaseChunk, [now?.iso8601, String(chunkID), owner])
        }
    }

    func fail(chunkID: Int64, error: String, now: Timestamp?) async throws {
        let owner = self.owner
        _ = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.prepared("fail_chunk", SQL.failChunk, [now?.iso8601, String(chunkID), owner, error])
        }
    }

    /// A daily unit or recompute job whose chunks are all done, marked done by this call.
    public enum Finished: Sendable, Hashable {
        /// `seconds` from the unit's first claim to now; `delaySeconds` from its due instant to now.
        case unit(
            timezone: String, localDate: LocalDate, version: Int, counts: WorkCounts, seconds: Double,
            delaySeconds: Double)
        case job(id: Int64, counts: WorkCounts, seconds: Double)
    }

    /// Marks done the units and jobs whose chunks are all done: one unit (`chunk`'s) right after its last
    /// chunk, or all of them (the tick's sweep) when `chunk` is nil.
    public func finishCompleted(after chunk: ClaimedChunk? = nil, now: Timestamp? = nil) async throws -> [Finished] {
        var parameters: [String?] = [now?.iso8601, nil, nil, nil, nil]
        switch chunk?.kind {
        case .daily(let zone, let date)?:
            parameters[1] = zone
            parameters[2] = date.description
            parameters[3] = chunk.map { String($0.version) }
        case .recompute(let id)?:
            parameters[4] = String(id)
        case nil:
            break
        }
        let finalParameters = parameters
        return try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared("finish_completed", SQL.finishCompletedParents, finalParameters)
            var finished: [Finished] = []
            for row in 0..<result.rowCount {
                let counts = WorkCounts(
                    total: try result.int(row, 4), done: try result.int(row, 5), written: try result.int(row, 8),
                    skipped: try result.int(row, 6))
                let seconds = result.string(row, 7).flatMap(Double.init) ?? 0
                if try result.requiredString(row, 0) == "job" {
                    guard let id = Int64(try result.requiredString(row, 1)) else { continue }
                    finished.append(.job(id: id, counts: counts, seconds: seconds))
                } else {
                    let dateText = try result.requiredString(row, 2)
                    guard let localDate = LocalDate(iso: dateText) else { continue }
                    finished.append(
                        .unit(
                            timezone: try result.requiredString(row, 1), localDate: localDate,
                            version: Int(try result.int(row, 3)), counts: counts, seconds: seconds,
                            delaySeconds: result.string(row, 9).flatMap(Double.init) ?? 0))
                }
            }
            return finished
        }
    }
}
