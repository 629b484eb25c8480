import HealthMetrics
import MetricsdPostgres
import Synchronization

extension WorkQueue {
    // MARK: Moving the old partition's history into monthly partitions

    /// What one call of ``moveHistory(batchRows:)`` did.
    public enum HistoryMoveStep: Sendable, Equatable {
        /// Nothing to move (no old partition with rows), or the move is done.
        case idle
        /// Another instance holds the move's lock, or a lock was not granted within its timeout: nothing done.
        case busy
        /// `rows` copied into `partition` (nil: the log only), `replayed` logged writes applied; `monthCopied` when
        /// that month is complete, `monthsLeft` months still to copy.
        case copied(partition: String?, rows: Int, replayed: Int, monthCopied: Bool, monthsLeft: Int)
        /// A month's indexes, foreign key and statistics made.
        case indexed(partition: String)
        /// Logged writes applied after the copy, before the swap.
        case caughtUp(replayed: Int)
        /// The months attached in place of the old partition.
        case swapped
        /// The old partition's foreign key dropped (the table goes in the next step).
        case droppedKey
        /// The old partition dropped: the move is done.
        case finished
    }

    /// Stops a long step in hand: a month's index build, its foreign key's validation or its vacuum, which can take
    /// minutes on a large month, is cancelled on the server (the month is indexed again later; an index left
    /// invalid is dropped first), and no further statement of the step starts. For a graceful stop.
    public final class HistoryMoveInterrupt: Sendable {
        private let canceller = Mutex<StatementCanceller?>(nil)
        private let interrupted = Atomic<Bool>(false)

        public init() {}

        var isInterrupted: Bool { self.interrupted.load(ordering: .acquiring) }

        func running(_ canceller: StatementCanceller?) {
            self.canceller.withLock { $0 = canceller }
        }

        /// Blocking (the cancel request is a connection of its own): call it off the cooperative pool.
        public func interrupt() {
            self.interrupted.store(true, ordering: .releasing)
            self.canceller.withLock { $0 }?.cancelStatement()
        }
    }

    /// The move's advisory lock ('metr', 'move'): copy, replay and swap take it per transaction, the index step per
    /// session.
    static let historyMoveLock = (1_835_365_490, 1_836_021_349)

    /// Takes the next step of moving the old partition's history into monthly partitions (migration 0019 says how):
    /// a batch of `batchRows` rows copied (after the logged writes replayed), one month's indexes built, the logged
    /// writes caught up, the swap, or the old partition dropped. Safe on every instance at once: a step another
    /// instance holds the lock of returns `.busy`. Every lock is taken with a timeout (100-200 ms).
    public func moveHistory(batchRows: Int = 10_000, interrupt: HistoryMoveInterrupt? = nil) async throws
        -> HistoryMoveStep
    {
        let state = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.query("SELECT state FROM history_move").string(0, 0)
        }
        switch state {
        case "copying": return try await self.copyHistory(batchRows: batchRows)
        case "indexing":
            // The log first: a month's foreign key is validated against the rows it holds, which must not include
            // those of a user deleted since.
            let (replayed, next) = try await self.pool.withConnection { connection in
                let replayed = try Self.readCommitted(connection) { connection in
                    try connection.query("SELECT metricsd_history_move_catch_up($1)", [String(batchRows)]).int(0, 0)
                }
                let next = try connection.query(
                    "SELECT partition FROM history_move_months WHERE NOT ready ORDER BY month LIMIT 1"
                ).string(0, 0)
                return (replayed, next)
            }
            if replayed < 0 { return .busy }
            if replayed >= 1000 { return .caughtUp(replayed: Int(replayed)) }
            if let partition = next { return try await self.indexMonth(partition, interrupt: interrupt) }
            return try await self.swap()
        case "swapped": return try await self.dropOldPartition()
        default: return .idle
        }
    }

    private func copyHistory(batchRows: Int) async throws -> HistoryMoveStep {
        try await self.pool.withConnection { connection in
            let result = try Self.readCommitted(connection) { connection in
                try connection.query("SELECT * FROM metricsd_history_move_copy($1)", [String(batchRows)])
            }
            guard result.rowCount == 1 else { return .busy }  // the state moved on meanwhile
            let partition = result.string(0, 0)
            let rows = Int(try result.int(0, 1))
            let replayed = Int(try result.int(0, 2))
            if partition == nil && replayed == 0 { return .busy }
            return .copied(
                partition: partition, rows: rows, replayed: replayed, monthCopied: try result.bool(0, 3),
                monthsLeft: Int(try result.int(0, 4)))
        }
    }

    /// Once every month is ready and the log is short: the swap, which replays the rest of the log under its locks
    /// (a longer log would hold them longer).
    private func swap() async throws -> HistoryMoveStep {
        try await self.pool.withConnection { connection in
            try Self.readCommitted(connection) { connection in
                try connection.query("SELECT metricsd_history_move_swap(1000)").bool(0, 0)
            } ? .swapped : .busy
        }
    }

    /// `body` in a READ COMMITTED transaction, whatever the server's default: the replay must see every log entry
    /// committed before each of its statements (the swap's last one, after its lock), which one snapshot for the
    /// whole transaction would not.
    static func readCommitted<T>(_ connection: PostgresConnection, _ body: (PostgresConnection) throws -> T) throws -> T
    {
        try connection.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        do {
            let value = try body(connection)
            try connection.execute("COMMIT")
            return value
        } catch {
            if connection.isHealthy { try? connection.execute("ROLLBACK") }
            throw error
        }
    }

    private func dropOldPartition() async throws -> HistoryMoveStep {
        try await self.pool.withConnection { connection in
            switch try connection.query("SELECT metricsd_history_move_drop()").string(0, 0) {
            case "dropped": .finished
            case "again": .droppedKey
            case "busy": .busy
            default: .idle
            }
        }
    }

    /// A month's indexes, built after its copy (sorted and packed, CONCURRENTLY: the log's replay goes on writing
    /// into it), its foreign key (NOT VALID with a 200 ms lock timeout, then validated: one anti-join, under a
    /// lock that blocks no reader or writer) and its statistics; then it is marked ready. Each part is skipped when
    /// already there, and an index a crash left invalid is dropped and built again. Under the move's session lock,
    /// one instance at a time; no statement deadline (a month's index takes as long as its rows need).
    private func indexMonth(_ partition: String, interrupt: HistoryMoveInterrupt?) async throws -> HistoryMoveStep {
        guard partition.utf8.allSatisfy({ ($0 >= 0x61 && $0 <= 0x7a) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x5f })
        else {
            throw PostgresError(code: .unexpectedResult, message: "history_move_months names the table \(partition)")
        }
        let (key1, key2) = Self.historyMoveLock
        return try await self.pool.withConnection { connection in
            let deadline = connection.statementDeadlineSeconds
            connection.statementDeadlineSeconds = nil
            defer { connection.statementDeadlineSeconds = deadline }
            guard try connection.query("SELECT pg_try_advisory_lock(\(key1), \(key2))").bool(0, 0) else { return .busy }
            defer { _ = try? connection.query("SELECT pg_advisory_unlock(\(key1), \(key2))") }
            interrupt?.running(connection.makeCanceller())
            defer { interrupt?.running(nil) }
            // One of the step's statements, unless the step was interrupted.
            func run(_ sql: String) throws {
                if interrupt?.isInterrupted == true {
                    throw PostgresError(code: .queryFailed, message: "the history move was stopped", sqlState: "57014")
                }
                try connection.execute(sql)
            }
            let invalid = try connection.query(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = $1::regclass AND NOT indisvalid",
                [partition])
            for row in 0..<invalid.rowCount {
                try run("DROP INDEX CONCURRENTLY IF EXISTS \(try invalid.requiredString(row, 0))")
            }
            try run(
                "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS \(partition)_date_version_user_key ON \(partition) (metrics_date, version, user_id)"
            )
            try run(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS \(partition)_user_computed_at_idx ON \(partition) (user_id, computed_at DESC)"
            )
            let key = try connection.query(
                "SELECT convalidated FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'f'", [partition])
            if key.rowCount == 0 {
                do {
                    try connection.transaction { connection in
                        try connection.execute("SET LOCAL lock_timeout = '200ms'")
                        try connection.execute(
                            "ALTER TABLE \(partition) ADD CONSTRAINT \(partition)_user_id_fkey FOREIGN KEY (user_id) REFERENCES users(id) ON DELETE CASCADE NOT VALID"
                        )
                    }
                } catch let error as PostgresError where error.sqlState == "55P03" {
                    return .busy
                }
            }
            let validated = key.rowCount == 1 ? try key.bool(0, 0) : false
            if !validated {
                try run("ALTER TABLE \(partition) VALIDATE CONSTRAINT \(partition)_user_id_fkey")
            }
            try run("VACUUM (ANALYZE) \(partition)")
            try connection.query("UPDATE history_move_months SET ready = true WHERE partition = $1", [partition])
            return .indexed(partition: partition)
        }
    }

    /// Whether daily or recompute work of this build's formula version is waiting: the move steps aside meanwhile.
    public func higherPriorityWorkWaiting() async throws -> Bool {
        try await self.higherPriorityWaiting(now: nil)
    }
}
