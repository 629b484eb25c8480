import HealthMetrics
import MetricsdPostgres

extension WorkQueue {
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
}

/// The fence found the chunk no longer ours: the batch rolls back.
struct LeaseLost: Error {}
