import HealthMetrics
import MetricsdPostgres

extension WorkQueue {
    // MARK: Retention runs

    /// A retention run created by `enqueueRetention`.
    public struct NewRetentionRun: Sendable, Hashable {
        public let id: Int64
        /// Rows computed before this instant may be removed.
        public let cutoff: Timestamp
        /// Every date in the table is examined, not only those since the last run.
        public let fullPass: Bool
        /// The metrics dates examined, one chunk each; nil when there was none (the run is done already).
        public let dates: ClosedRange<LocalDate>?
        public let chunks: Int
    }

    /// Creates a retention run for `days` when none is active and the cutoff has moved an hour past the last
    /// one's (`SQL.enqueueRetention`); nil when nothing was created. Safe on every instance at once.
    public func enqueueRetention(days: Int, now: Timestamp? = nil) async throws -> NewRetentionRun? {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared(
                "enqueue_retention", SQL.enqueueRetention, [now?.iso8601, String(days), Self.newestMigration])
            guard result.rowCount == 1 else { return nil }
            var dates: ClosedRange<LocalDate>?
            if let from = result.string(0, 3).flatMap({ LocalDate(iso: $0) }),
                let to = result.string(0, 4).flatMap({ LocalDate(iso: $0) }), from <= to
            {
                dates = from...to
            }
            return NewRetentionRun(
                id: try result.int(0, 0), cutoff: Timestamp(millisecondsSinceEpoch: try result.int(0, 1)),
                fullPass: try result.bool(0, 2), dates: dates, chunks: Int(try result.int(0, 5)))
        }
    }

    /// What processing a retention chunk came to.
    public struct RetentionProgress: Sendable, Equatable {
        public enum End: Sendable, Equatable {
            /// Every row of the chunk's date was examined.
            case finished
            /// Stopped between batches because `shouldStop` said so; the chunk was handed back.
            case stopped
            /// Daily or recompute work was waiting: the chunk was handed back between batches, to be resumed.
            case yielded
            /// Another worker holds the chunk now (this one's lease expired): the last batch was rolled back.
            case leaseLost
        }
        public var end: End
        /// Rows removed.
        public var removed = 0
        public var batches = 0
    }

    /// Works through a retention chunk batch by batch until its date is done, `shouldStop()` is true, daily or
    /// recompute work is waiting, or the lease is lost. `afterBatch` runs after every committed batch.
    public func process(
        _ chunk: RetentionChunk, now: Timestamp? = nil, shouldStop: @Sendable () -> Bool = { false },
        afterBatch: @Sendable (RetentionProgress) -> Void = { _ in }
    ) async throws -> RetentionProgress {
        var progress = RetentionProgress(end: .finished)
        var cursor = chunk.cursor
        while true {
            if shouldStop() {
                try await self.release(chunkID: chunk.id, now: now)
                progress.end = .stopped
                return progress
            }
            guard let step = try await self.removeBatch(chunk, after: cursor, now: now) else {
                progress.end = .leaseLost
                return progress
            }
            progress.batches += 1
            progress.removed += step.removed
            cursor = step.cursor
            afterBatch(progress)
            if step.last { return progress }
            if try await self.higherPriorityWaiting(now: now) {
                try await self.release(chunkID: chunk.id, now: now)
                progress.end = .yielded
                return progress
            }
        }
    }

    private struct RemovalStep {
        let cursor: Int64
        let removed: Int
        let last: Bool
    }

    /// Removes what the next batch of the chunk's date may lose (`SQL.retentionBatch`), fenced on the lease, and
    /// counts it on the chunk in the same transaction. Nil when the lease is lost.
    private func removeBatch(_ chunk: RetentionChunk, after cursor: Int64, now: Timestamp?) async throws -> RemovalStep?
    {
        let owner = self.owner
        let configuration = self.configuration
        let faults = self.faults
        return try await self.pool.withConnection { connection -> RemovalStep? in
            do {
                return try connection.transaction { connection in
                    let result = try connection.prepared(
                        "retention_batch", SQL.retentionBatch,
                        [
                            now?.iso8601, String(chunk.id), owner, String(cursor), chunk.date.description,
                            String(configuration.batchSize), String(chunk.runID), String(configuration.leaseSeconds),
                        ])
                    guard try result.int(0, 0) == 1 else { throw LeaseLost() }
                    let removed = Int(try result.int(0, 1))
                    if removed > 0 {
                        try connection.prepared(
                            "count_removed", "UPDATE work_chunks SET rows_removed = rows_removed + $2 WHERE id = $1",
                            [String(chunk.id), String(removed)])
                    }
                    try faults.retentionBeforeCommit?(connection, chunk)
                    return RemovalStep(cursor: try result.int(0, 3), removed: removed, last: try result.bool(0, 2))
                }
            } catch is LeaseLost {
                return nil
            }
        }
    }

    /// Whether daily or recompute work of this build's formula version is waiting (`SQL.higherPriorityWaiting`).
    func higherPriorityWaiting(now: Timestamp?) async throws -> Bool {
        let version = String(self.formula.version)
        return try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.prepared("higher_priority_waiting", SQL.higherPriorityWaiting, [now?.iso8601, version])
                .bool(0, 0)
        }
    }

    /// Gives a retention chunk back at once (graceful stop).
    public func release(_ chunk: RetentionChunk, now: Timestamp? = nil) async throws {
        try await self.release(chunkID: chunk.id, now: now)
    }

    /// Records a failed attempt on a retention chunk; it becomes claimable again after a backoff.
    public func fail(_ chunk: RetentionChunk, error: String, now: Timestamp? = nil) async throws {
        try await self.fail(chunkID: chunk.id, error: error, now: now)
    }

    /// A retention run whose chunks are all done, marked done by `finishRetentionRuns`.
    public struct FinishedRetentionRun: Sendable, Hashable {
        public let id: Int64
        public let cutoff: Timestamp
        public let days: Int
        public let removed: Int64
        /// From its first claim (or its creation) to now.
        public let seconds: Double
    }

    /// Marks done the retention run of `chunk` once all its chunks are, or every such run when `chunk` is nil
    /// (the tick's sweep, for a crash between a last chunk's commit and this step).
    public func finishRetentionRuns(after chunk: RetentionChunk? = nil, now: Timestamp? = nil) async throws
        -> [FinishedRetentionRun]
    {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.prepared(
                "finish_retention_runs", SQL.finishRetentionRuns, [now?.iso8601, chunk.map { String($0.runID) }])
            return try (0..<result.rowCount).map { row in
                FinishedRetentionRun(
                    id: try result.int(row, 0), cutoff: Timestamp(millisecondsSinceEpoch: try result.int(row, 1)),
                    days: Int(try result.int(row, 2)), removed: try result.int(row, 3),
                    seconds: result.string(row, 4).flatMap(Double.init) ?? 0)
            }
        }
    }
}
