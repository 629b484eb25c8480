import CoreMetrics
import HealthMetrics
import Logging

/// Durable, claimable work over PostgreSQL: daily units and recompute jobs, split into chunks of user-id ranges
/// that any instance claims with a row lease and works through in keyset batches.
///
/// One mechanism serves both kinds: `claim` takes the next chunk (daily first), `process` writes it batch by
/// batch, each batch's upserts and the chunk's cursor and lease renewal in one transaction fenced on the lease.
/// A crash loses at most the uncommitted batch; another instance resumes from the cursor once the lease has
/// expired by the database clock.
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
            let created = try connection.prepared("enqueue_due_units", SQL.enqueueDueUnits, parameters)
            return try (0..<created.rowCount).map { row in
                let date = try created.requiredString(row, 1)
                guard let localDate = LocalDate(iso: date) else {
                    throw PostgresError(code: .unexpectedResult, message: "unit date \(date) is not a date")
                }
                return NewUnit(
                    timezone: try created.requiredString(row, 0), localDate: localDate, chunks: Int(try created.int(row, 2)))
            }
        }
    }

    // MARK: Claiming and processing

    /// Claims the next free chunk, daily work first; nil when there is nothing to do.
    public func claim(now: Timestamp? = nil) async throws -> ClaimedChunk? {
        let owner = self.owner
        let lease = String(self.configuration.leaseSeconds)
        let version = String(self.formula.version)
        return try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared(
                "claim_chunk", SQL.claimChunk, [now?.iso8601, owner, lease, version, Self.newestMigration])
            guard result.rowCount == 1 else { return nil }
            return try ClaimedChunk(result, row: 0)
        }
    }

    /// What processing a chunk came to.
    public struct ChunkProgress: Sendable, Equatable {
        public enum End: Sendable, Equatable {
            /// Every user of the chunk's range was processed.
            case finished
            /// Stopped between batches because `shouldStop` said so; the lease was released.
            case stopped
            /// Another worker holds the chunk now (this one's lease expired) or it was cancelled/superseded: the
            /// last batch was rolled back.
            case leaseLost
        }
        public var end: End
        /// Valid users evaluated: `written` + `alreadyCurrent`.
        public var computed = 0
        /// Rows inserted or changed.
        public var written = 0
        /// Users whose settings give no metrics (a skip verdict recorded).
        public var skipped = 0
        /// Skip reasons by code (a user skipped for two reasons counts under both).
        public var skipCounts: [SkipReason.Code: Int] = [:]
        public var batches = 0

        /// Users read and evaluated: written + already current + skipped.
        public var examined: Int { self.computed + self.skipped }
        /// Valid users who already had the same row for the date and version.
        public var alreadyCurrent: Int { self.computed - self.written }
    }

    /// Works through a claimed chunk batch by batch until its range is done, `shouldStop()` is true, or the
    /// lease is lost. `afterBatch` runs after every committed batch (the scheduler's heartbeat).
    public func process(
        _ chunk: ClaimedChunk, now: Timestamp? = nil, shouldStop: @Sendable () -> Bool = { false },
        afterBatch: @Sendable (ChunkProgress) -> Void = { _ in }
    ) async throws -> ChunkProgress {
        var progress = ChunkProgress(end: .finished)
        var cursor = chunk.cursor
        while true {
            if shouldStop() {
                try await self.release(chunk, now: now)
                progress.end = .stopped
                return progress
            }
            let step = try await self.processBatch(chunk, after: cursor, now: now)
            guard let step else {
                progress.end = .leaseLost
                return progress
            }
            progress.batches += 1
            progress.computed += step.computed
            progress.written += step.written
            progress.skipped += step.skipped
            progress.skipCounts.merge(step.skipCounts, uniquingKeysWith: +)
            cursor = step.cursor
            afterBatch(progress)
            if step.last { return progress }
        }
    }

    private struct BatchStep {
        let cursor: Int64
        let computed: Int
        let written: Int
        let skipped: Int
        let skipCounts: [SkipReason.Code: Int]
        let last: Bool
    }

    /// Reads the next batch after `cursor`, evaluates it and commits it with the fence. Nil when the lease is lost.
    private func processBatch(_ chunk: ClaimedChunk, after cursor: Int64, now: Timestamp?) async throws -> BatchStep? {
        let formula = self.formula
        let owner = self.owner
        let configuration = self.configuration
        let faults = self.faults
        return try await self.pool.withConnection { connection -> BatchStep? in
            let limit = String(configuration.batchSize)
            let read: PostgresResult
            switch chunk.kind {
            case .daily(let zone, let date):
                read = try connection.prepared(
                    "read_daily_batch", SQL.readDailyBatch,
                    [now?.iso8601, date.description, zone, String(cursor), String(chunk.rangeEnd), limit])
            case .recompute:
                read = try connection.prepared(
                    "read_range_batch", SQL.readRangeBatch,
                    [now?.iso8601, nil, String(cursor), String(chunk.rangeEnd), limit])
            }
            let rows = try UserRow.decode(read)
            let last = rows.count < configuration.batchSize
            let newCursor = last ? chunk.rangeEnd : (rows.last?.id ?? cursor)
            let batch = EvaluatedBatch(rows, formula: formula)
            let fence = BatchWriter.Fence(
                chunkID: chunk.id, owner: owner, cursor: newCursor, leaseSeconds: configuration.leaseSeconds,
                last: last)
            let written: Int
            do {
                written = try connection.transaction { connection in
                    let outcome = try BatchWriter.write(
                        batch, conflict: chunk.conflict, fence: fence, source: chunk.source, now: now,
                        formula: formula, on: connection)
                    guard outcome.fenced else { throw LeaseLost() }
                    if outcome.written > 0 {
                        try connection.prepared(
                            "count_written", "UPDATE work_chunks SET users_written = users_written + $2 WHERE id = $1",
                            [String(chunk.id), String(outcome.written)])
                    }
                    try faults.beforeCommit?(connection, chunk)
                    return outcome.written
                }
            } catch is LeaseLost {
                return nil
            }
            try faults.afterCommit?(connection, chunk)
            return BatchStep(
                cursor: newCursor, computed: batch.computedIDs.count, written: written,
                skipped: batch.skippedIDs.count, skipCounts: batch.skipCounts, last: last)
        }
    }

    /// Gives the chunk back at once so a peer can take it over (graceful stop).
    public func release(_ chunk: ClaimedChunk, now: Timestamp? = nil) async throws {
        let owner = self.owner
        _ = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.prepared("release_chunk", SQL.releaseChunk, [now?.iso8601, String(chunk.id), owner])
        }
    }

    /// Records a failed attempt; the chunk becomes claimable again after a backoff.
    public func fail(_ chunk: ClaimedChunk, error: String, now: Timestamp? = nil) async throws {
        let owner = self.owner
        _ = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.prepared("fail_chunk", SQL.failChunk, [now?.iso8601, String(chunk.id), owner, error])
        }
    }

    /// A daily unit or recompute job whose chunks are all done, marked done by this call.
    public enum Finished: Sendable, Hashable {
        /// `seconds` from the unit's first claim to now; `delaySeconds` from its due instant to now.
        case unit(timezone: String, localDate: LocalDate, version: Int, counts: WorkCounts, seconds: Double, delaySeconds: Double)
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

/// A chunk this worker holds.
public struct ClaimedChunk: Sendable, Hashable {
    public enum Kind: Sendable, Hashable {
        case daily(timezone: String, localDate: LocalDate)
        case recompute(jobID: Int64)
    }
    public let id: Int64
    public let kind: Kind
    public let version: Int
    public let rangeStart: Int64
    public let rangeEnd: Int64
    /// The last user id committed before this claim (resume point).
    public let cursor: Int64
    public let attempts: Int
    /// The instance whose lease on this chunk had expired while it was running (it crashed or stalled), when
    /// that was another instance; nil for a fresh chunk, a retry after a failure, or one handed back on shutdown.
    public let takenOverFrom: String?

    init(_ result: PostgresResult, row: Int) throws(PostgresError) {
        self.id = try result.int(row, 0)
        let kind = try result.requiredString(row, 1)
        if kind == "daily" {
            let dateText = try result.requiredString(row, 3)
            guard let date = LocalDate(iso: dateText) else {
                throw PostgresError(code: .unexpectedResult, message: "chunk date \(dateText) is not a date")
            }
            self.kind = .daily(timezone: try result.requiredString(row, 2), localDate: date)
        } else {
            self.kind = .recompute(jobID: try result.int(row, 5))
        }
        self.version = Int(try result.int(row, 4))
        self.rangeStart = try result.int(row, 6)
        self.rangeEnd = try result.int(row, 7)
        self.cursor = try result.int(row, 8)
        self.attempts = Int(try result.int(row, 9))
        self.takenOverFrom = result.string(row, 10)
    }

    var conflict: SQL.Conflict {
        switch self.kind {
        case .daily: .updateIfChanged
        case .recompute: .keep
        }
    }

    var source: String {
        switch self.kind {
        case .daily: "daily"
        case .recompute: "recompute"
        }
    }
}

/// What a unit, job or chunk came to, in the words every report uses: of the users **examined**, **written**
/// (row inserted or changed), **already current** (the same row was there) and **skipped** (settings give no
/// metrics).
public struct WorkCounts: Sendable, Hashable {
    /// Users when the unit or job was created.
    public var total: Int64
    public var written: Int64
    public var alreadyCurrent: Int64
    public var skipped: Int64
    public var examined: Int64 { self.written + self.alreadyCurrent + self.skipped }

    public init(total: Int64, written: Int64, alreadyCurrent: Int64, skipped: Int64) {
        self.total = total
        self.written = written
        self.alreadyCurrent = alreadyCurrent
        self.skipped = skipped
    }

    /// From the chunk columns: `done` users have the row after the chunk (written or already there).
    init(total: Int64, done: Int64, written: Int64, skipped: Int64) {
        self.init(total: total, written: written, alreadyCurrent: max(0, done - written), skipped: skipped)
    }
}

/// The fence found the chunk no longer ours: the batch rolls back.
struct LeaseLost: Error {}
