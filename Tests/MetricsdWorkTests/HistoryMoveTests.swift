import Foundation
import HealthMetrics
import Logging
import MetricsdTestSupport
import Synchronization
import Testing

@testable import MetricsdPostgres
@testable import MetricsdWork

/// An install upgraded from the release before 0017, with its history in the old partition: the migrations close
/// that partition after its newest date, and `WorkQueue.moveHistory` moves its rows into monthly partitions while
/// they are read and written, resumes after a crash, and is shared by instances without doing a row twice.
@Suite struct HistoryMoveTests {
    static let users = 60
    static let days = 730

    static let today = TestDatabase.today

    /// Every row of dates before `$1`, with every column, in id order: count and digest.
    static let rowSet = """
        SELECT count(*) || ' ' || coalesce(md5(string_agg(concat_ws('|', id, user_id, bmi, bmr, tdee, version, metrics_date,
                                                                   computed_at), ';' ORDER BY id)), '-')
        FROM profile_metrics WHERE metrics_date < $1::date
        """

    static let acknowledgements = """
        SELECT string_agg(concat_ws('|', user_id, version, metrics_computed_at, acknowledged_at), ';' ORDER BY user_id)
        FROM metrics_acknowledgements
        """

    /// Rows that are not in their month's partition (a partition's name is its month, or its first day), and
    /// (date, version, user) keys held twice.
    static let misplaced = """
        SELECT (SELECT count(*) FROM profile_metrics p JOIN pg_class c ON c.oid = p.tableoid
                WHERE left(c.relname, 23) <> 'profile_metrics_' || to_char(p.metrics_date, 'YYYY_MM'))
             + (SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY metrics_date, version, user_id
                                      HAVING count(*) > 1) d)
        """

    static func upgradedInstall(users: Int = Self.users, days: Int = Self.days) async throws -> TestDatabase {
        try await TestDatabase.upgradedInstall(users: users, days: days)
    }

    /// The old partition closes after its newest date (yesterday): today's rows go into a partition from today to
    /// the end of the month, the old one keeps its rows in the same file, nothing a reader sees changes, a row
    /// dated before the bound still goes into the old partition and is logged for the move, and the move is set up
    /// with one table per month of the history.
    @Test func theMigrationClosesTheOldPartitionAfterItsNewestDate() async throws {
        try await withTestDatabase(try await Self.upgradedInstall(users: 20, days: 90)) {
            database in
            let bound = try #require(try await database.value("SELECT \(Self.today)::text"))
            let old = try #require(
                try await database.value(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'profile_metrics'::regclass AND c.relname LIKE 'profile_metrics_until_%'"
                ))
            let fileBefore = try await database.value("SELECT pg_relation_filenode('\(old)')")
            let rowsBefore = try await database.value(Self.rowSet, [bound])
            let keptBefore = try await database.value(HistoryQueries.kept)
            let acknowledgedBefore = try await database.value(Self.acknowledgements)

            #expect(try await database.migrate() == Migration.all.map(\.name).filter { $0 >= "0017" })
            let closed = try #require(
                try await database.value(
                    "SELECT replace(metricsd_partition_name('\(bound)'), 'profile_metrics_', 'profile_metrics_until_')")
            )
            let partitions = try #require(try await database.value(HistoryQueries.partitions)).split(separator: "\n")
                .map(String.init)
            #expect(partitions.contains("\(closed) FOR VALUES FROM (MINVALUE) TO ('\(bound)')"), "\(partitions)")
            let todays = try #require(try await database.value("SELECT metricsd_partition_name('\(bound)')"))
            let monthEnd = try #require(
                try await database.value(
                    "SELECT (date_trunc('month', '\(bound)'::date) + interval '1 month')::date::text"))
            #expect(partitions.contains("\(todays) FOR VALUES FROM ('\(bound)') TO ('\(monthEnd)')"), "\(partitions)")
            #expect(
                try await database.value("SELECT pg_relation_filenode('\(closed)')") == fileBefore,
                "attached again, not copied")
            #expect(try await database.value(Self.rowSet, [bound]) == rowsBefore)
            #expect(try await database.value(HistoryQueries.kept) == keptBefore)
            #expect(try await database.value(Self.acknowledgements) == acknowledgedBefore)
            #expect(
                try await database.value(
                    "SELECT count(*) FROM pg_constraint WHERE conname = 'profile_metrics_dates_before_bound'") == "0")

            // Today's row goes into today's partition; yesterday's (a zone behind) still into the old one, logged.
            try await database.execute(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date)
                VALUES (1, 25.0, 1600, 2100, 2, \(Self.today)), (2, 25.0, 1600, 2100, 2, \(Self.today) - 1)
                """)
            #expect(
                try await database.value(
                    "SELECT string_agg(tableoid::regclass::text, ',' ORDER BY user_id) FROM profile_metrics WHERE version = 2"
                )
                    == "\(todays),\(closed)")
            #expect(try await database.value("SELECT op || user_id FROM history_move_log") == "I2")

            // One table per month of the history, the first of them taking every older date.
            let first = try #require(
                try await database.value(
                    "SELECT metricsd_partition_name(date_trunc('month', \(Self.today) - 90)::date)"))
            #expect(try await database.value("SELECT state || ' ' || source FROM history_move") == "copying \(closed)")
            #expect(
                try await database.value(
                    "SELECT string_agg(partition || ':' || coalesce(range_from::text, 'MINVALUE'), ',' ORDER BY month) FROM history_move_months LIMIT 1"
                )?
                .hasPrefix("\(first):MINVALUE,") == true)
            #expect(try await database.value("SELECT max(range_to)::text FROM history_move_months") == bound)
        }
    }

    /// A fresh install (an empty old partition): it is bound at the current month, the months from there have
    /// partitions, and there is nothing to move.
    @Test func aFreshInstallHasNothingToMove() async throws {
        try await withTestDatabase { database in
            let start = try #require(
                try await database.value(
                    "SELECT date_trunc('month', (now() AT TIME ZONE 'Etc/GMT+12')::date)::date::text"))
            let partitions = try #require(try await database.value(HistoryQueries.partitions))
            #expect(partitions.contains("FOR VALUES FROM (MINVALUE) TO ('\(start)')"), "\(partitions)")
            #expect(try await database.value("SELECT count(*) FROM history_move") == "0")
            #expect(try await WorkQueueTests.queue(database).moveHistory() == .idle)
        }
    }

    /// The move, with every kind of work beside it: readers of the history (lock timeout 1 s) that must see each
    /// row once, writes to the old partition's rows (deletes, updates, inserts, some in REPEATABLE READ, and a
    /// user's deletion) and a daily unit. At the end every row is in its month's partition, the rows are those
    /// the old partition held with every write applied (ids, values, computed_at), the latest table matches the
    /// history, the acknowledgements are untouched, no key is held twice, no lock was waited on for a second, and
    /// the old partition is gone.
    @Test func anUpgradedHistoryMovesIntoItsMonthsWhileItIsReadAndWritten() async throws {
        try await withTestDatabase(try await Self.upgradedInstall()) { database in
            _ = try await database.migrate()
            let bound = try #require(try await database.value("SELECT \(Self.today)::text"))
            let source = try #require(try await database.value("SELECT source FROM history_move"))
            let acknowledgedBefore = try #require(try await database.value(Self.acknowledgements))
            try await database.execute("CREATE TABLE expected AS SELECT * FROM profile_metrics")

            let stop = Flag()
            async let reads = Self.read(database.url, users: Self.users, stop: stop)
            async let writes = Self.write(database.url, users: Self.users, stop: stop)
            async let waited = Self.longestLockWait(database.url, stop: stop)
            async let daily = Self.dailyUnit(WorkQueueTests.queue(database, owner: "daily"))
            let steps: [WorkQueue.HistoryMoveStep]
            do {
                steps = try await Self.moveToTheEnd(WorkQueueTests.queue(database), batchRows: 1000)
            } catch {
                stop.set()
                throw error
            }
            stop.set()
            let (readCount, problems) = try await reads
            #expect(readCount > 0)
            #expect(problems.isEmpty, "\(problems.prefix(5))")
            #expect(try await writes > 10)
            #expect(try await waited < 1.0, "the longest lock wait, in seconds")
            #expect(try await daily == Self.users)

            #expect(steps.last == .finished)
            #expect(steps.contains(.swapped))
            let replayed = steps.reduce(0) { total, step in
                switch step {
                case .copied(_, _, let replayed, _, _), .caughtUp(let replayed): total + replayed
                default: total
                }
            }
            #expect(replayed > 0, "writes were logged and replayed during the move")
            #expect(try await database.value("SELECT state FROM history_move") == "done")
            #expect(
                try await database.value("SELECT to_regclass('\(source)') IS NULL") == "t",
                "the old partition is dropped")
            #expect(try await database.value("SELECT count(*) FROM history_move_log") == "0")
            #expect(try await database.value(Self.misplaced) == "0")
            #expect(
                try await database.value(Self.rowSet, [bound])
                    == database.value(
                        Self.rowSet.replacingOccurrences(of: "FROM profile_metrics", with: "FROM expected"), [bound]))
            #expect(try await database.value(HistoryQueries.kept) == database.value(HistoryQueries.fromHistory))
            #expect(
                try await database.value(
                    "SELECT count(*) FROM profile_metrics_latest WHERE metrics_date = \(Self.today)")
                    == String(Self.users - 1), "every user's newest row is today's, but the deleted user's")
            let acknowledged = acknowledgedBefore.split(separator: ";").filter { !$0.hasPrefix("\(Self.users)|") }
            #expect(try await database.value(Self.acknowledgements) == acknowledged.joined(separator: ";"))
            try await Self.expectKeysInPlace(database)
        }
    }

    /// An instance whose connection dies in the middle of a batch leaves nothing of it (the month's rows, its
    /// cursor and the log as before); two instances then finish the move together, each copying part of it and no
    /// row twice, and every row is kept.
    @Test func aKilledMoveResumesAndTwoInstancesShareIt() async throws {
        try await withTestDatabase(try await Self.upgradedInstall(users: 40, days: 400)) {
            database in
            _ = try await database.migrate()
            let bound = try #require(try await database.value("SELECT \(Self.today)::text"))
            let keptBefore = try await database.value(HistoryQueries.kept)
            // Writes before the copy reaches them: ten rows of the oldest month go, and are logged.
            try await database.execute(
                "DELETE FROM profile_metrics WHERE metrics_date = \(Self.today) - 399 AND user_id <= 10")
            let expected = try await database.value(Self.rowSet, [bound])
            let a = try Self.instance(database, owner: "a")
            let b = try Self.instance(database, owner: "b")
            defer {
                Task {
                    await a.pool.close()
                    await b.pool.close()
                }
            }

            var copied = 0
            for _ in 0..<3 {
                guard case .copied(_, let rows, _, _, _) = try await a.queue.moveHistory(batchRows: 500) else {
                    Issue.record("the first steps copy")
                    return
                }
                copied += rows
            }
            let month = try #require(
                try await database.value(
                    "SELECT partition FROM history_move_months WHERE NOT copied ORDER BY month DESC LIMIT 1"))
            let progress =
                "SELECT (SELECT rows_copied || '/' || cursor_date || '/' || cursor_user FROM history_move_months WHERE partition = '\(month)') || ' ' || (SELECT count(*) FROM \(month)) || ' ' || (SELECT count(*) FROM history_move_log)"
            let before = try await database.value(progress)
            try await database.execute(
                """
                CREATE FUNCTION test_crash() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$;
                CREATE TRIGGER test_crash BEFORE INSERT ON \(month) FOR EACH STATEMENT EXECUTE FUNCTION test_crash()
                """)
            await #expect(throws: PostgresError.self, "the connection dies in the batch") {
                _ = try await a.queue.moveHistory(batchRows: 500)
            }
            #expect(try await database.value(progress) == before, "nothing of the batch is left")
            try await database.execute("DROP TRIGGER test_crash ON \(month); DROP FUNCTION test_crash()")

            async let byA = Self.moveToTheEnd(a.queue, batchRows: 500)
            async let byB = Self.moveToTheEnd(b.queue, batchRows: 500)
            let (stepsA, stepsB) = try await (byA, byB)
            let (rowsA, rowsB) = (Self.rowsCopied(stepsA), Self.rowsCopied(stepsB))
            #expect(rowsA > 0 && rowsB > 0, "both instances copied: \(rowsA), \(rowsB)")
            #expect(copied + rowsA + rowsB == 40 * 400 - 10, "each row copied once")
            #expect(
                try await database.value("SELECT sum(rows_copied) FROM history_move_months") == String(40 * 400 - 10))
            #expect(try await database.value("SELECT state FROM history_move") == "done")
            #expect(try await database.value(Self.rowSet, [bound]) == expected)
            #expect(try await database.value(HistoryQueries.kept) == keptBefore)
            #expect(try await database.value(Self.misplaced) == "0")
            try await Self.expectKeysInPlace(database)
        }
    }

    /// A month's index build that waits (here on a transaction holding its table) stops at once when the step is
    /// interrupted, as on a graceful stop; the index it leaves invalid is dropped and built again by the next step,
    /// and the move ends with every key valid.
    @Test func anInterruptedIndexBuildIsDoneAgain() async throws {
        try await withTestDatabase(try await Self.upgradedInstall(users: 20, days: 40)) {
            database in
            _ = try await database.migrate()
            let queue = WorkQueueTests.queue(database)
            while try await database.value("SELECT state FROM history_move") == "copying" {
                _ = try await queue.moveHistory(batchRows: 1000)
            }
            let month = try #require(
                try await database.value(
                    "SELECT partition FROM history_move_months ORDER BY month LIMIT 1"))
            let blocker = try Self.instance(database, owner: "blocker")
            defer { Task { await blocker.pool.close() } }
            try await blocker.pool.withConnection { try $0.execute("BEGIN; LOCK TABLE \(month) IN ROW EXCLUSIVE MODE") }

            let interrupt = WorkQueue.HistoryMoveInterrupt()
            async let step: Result<WorkQueue.HistoryMoveStep, any Error> = {
                do { return .success(try await queue.moveHistory(batchRows: 1000, interrupt: interrupt)) } catch {
                    return .failure(error)
                }
            }()
            let waiting = await DaemonProcess.eventually(timeout: .seconds(10)) {
                (try? await database.value(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE UNIQUE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'"
                ))
                    == "1"
            }
            #expect(waiting, "the index build waits for the transaction")
            let started = ContinuousClock.now
            try await blocker.pool.runBlocking { interrupt.interrupt() }
            guard case .failure(let error as PostgresError) = await step else {
                Issue.record("the step is cancelled")
                return
            }
            #expect(error.sqlState == "57014", "\(error)")
            #expect(ContinuousClock.now - started < .seconds(5))
            #expect(
                try await database.value(
                    "SELECT count(*) FROM pg_index WHERE indrelid = '\(month)'::regclass AND NOT indisvalid") == "1")
            try await blocker.pool.withConnection { try $0.execute("ROLLBACK") }

            #expect(try await Self.moveToTheEnd(queue, batchRows: 1000).last == .finished)
            try await Self.expectKeysInPlace(database)
        }
    }

    // MARK: Helpers

    /// Every index valid, and every partition's key and foreign key parts of profile_metrics' own (attached, so
    /// enforced as the table's); a duplicate of a moved row's key is refused.
    static func expectKeysInPlace(_ database: TestDatabase, sourceLocation: SourceLocation = #_sourceLocation)
        async throws
    {
        #expect(
            try await database.value("SELECT count(*) FROM pg_index WHERE NOT indisvalid") == "0",
            sourceLocation: sourceLocation)
        #expect(
            try await database.value(
                """
                SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'profile_metrics'::regclass
                  AND ((SELECT count(*) FROM pg_index x JOIN pg_inherits h ON h.inhrelid = x.indexrelid WHERE x.indrelid = c.oid) <> 2
                       OR NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'f' AND k.conparentid <> 0))
                """) == "0", "each partition's keys and foreign key belong to profile_metrics'",
            sourceLocation: sourceLocation)
        await #expect(throws: PostgresError.self, "a second row of a moved key", sourceLocation: sourceLocation) {
            try await database.execute(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT user_id, bmi, bmr, tdee, version, metrics_date, computed_at FROM profile_metrics
                WHERE metrics_date = (SELECT min(metrics_date) FROM profile_metrics) LIMIT 1
                """)
        }
    }

    /// An instance of its own: a queue on a pool of its own.
    static func instance(_ database: TestDatabase, owner: String) throws -> (queue: WorkQueue, pool: PostgresPool) {
        let pool = PostgresPool(
            settings: try ConnectionSettings(conninfo: database.url, environment: [:]), configuration: .init(size: 2),
            logger: database.logger)
        return (WorkQueue(pool: pool, formula: .current, owner: owner, logger: database.logger), pool)
    }

    /// Takes the move's steps as the daemon's mover does until there is nothing left: after a copy batch, a pause
    /// as long as it took; after a busy step, 5 ms.
    static func moveToTheEnd(_ queue: WorkQueue, batchRows: Int) async throws -> [WorkQueue.HistoryMoveStep] {
        var steps: [WorkQueue.HistoryMoveStep] = []
        while true {
            let started = ContinuousClock.now
            let step = try await queue.moveHistory(batchRows: batchRows)
            steps.append(step)
            switch step {
            case .finished, .idle: return steps
            case .busy: try await Task.sleep(for: .milliseconds(5))
            case .copied: try await Task.sleep(for: ContinuousClock.now - started)
            default: break
            }
        }
    }

    static func rowsCopied(_ steps: [WorkQueue.HistoryMoveStep]) -> Int {
        steps.reduce(0) { total, step in
            if case .copied(_, let rows, _, _, _) = step { return total + rows }
            return total
        }
    }

    /// Today's daily unit of every user (METRICSD_DAILY_AT 00:00, the database's clock); returns the users written.
    static func dailyUnit(_ queue: WorkQueue) async throws -> Int {
        _ = try await queue.enqueueDueUnits(dailyAt: try #require(DailyTime(hour: 0, minute: 0)))
        var written = 0
        while let chunk = try await queue.claim() {
            written += try await queue.process(chunk).written
        }
        _ = try await queue.finishCompleted()
        return written
    }

    /// Reads one date of the history at a time on a connection of its own (lock timeout 1 s), until `stop`; a date
    /// the writer leaves alone must hold each of its users once (all of them, or all but the deleted one). Returns
    /// the reads made and what was wrong.
    static func read(_ url: String, users: Int, stop: Flag) async throws -> (reads: Int, problems: [String]) {
        try await FaultDatabase(url: url, applicationName: "history-reader").withConnection { connection in
            try connection.execute("SET lock_timeout = '1s'")
            var random = SplitMix64(seed: 7)
            var reads = 0
            var problems: [String] = []
            while !stop.isSet {
                var back = 1 + random.next(upTo: Self.days)
                if (395...425).contains(back) { back -= 40 }
                do {
                    let result = try connection.query(
                        """
                        SELECT count(*) || ' ' || count(DISTINCT id) || ' ' || count(DISTINCT user_id)
                        FROM profile_metrics WHERE metrics_date = \(Self.today) - $1::int
                        """, [String(back)])
                    let counts = try result.requiredString(0, 0)
                    if counts != "\(users) \(users) \(users)" && counts != "\(users - 1) \(users - 1) \(users - 1)" {
                        problems.append("\(back) days back: \(counts)")
                    }
                } catch {
                    problems.append("\(error)")
                }
                reads += 1
                usleep(2000)
            }
            return (reads, problems)
        }
    }

    /// Writes to the old partition's rows dated 400 to 420 days back until `stop`, each write and its twin in
    /// `expected` in one statement, every third in a REPEATABLE READ transaction: deletes, updates, and inserts of
    /// rows that a delete removed; after 20 writes, deletes the last user (their rows go by the foreign key's
    /// cascade). Returns the writes made.
    static func write(_ url: String, users: Int, stop: Flag) async throws -> Int {
        try await FaultDatabase(url: url, applicationName: "history-writer").withConnection { connection in
            var random = SplitMix64(seed: 11)
            var writes = 0
            while !stop.isSet {
                let user = String(1 + random.next(upTo: users - 1))
                let back = String(400 + random.next(upTo: 21))
                let statement: String
                switch random.next(upTo: 3) {
                case 0:
                    statement =
                        "WITH d AS (DELETE FROM profile_metrics WHERE user_id = $1 AND metrics_date = \(Self.today) - $2::int RETURNING id) DELETE FROM expected WHERE id IN (SELECT id FROM d)"
                case 1:
                    statement =
                        "WITH u AS (UPDATE profile_metrics SET bmr = bmr + 1 WHERE user_id = $1 AND metrics_date = \(Self.today) - $2::int RETURNING id) UPDATE expected SET bmr = bmr + 1 WHERE id IN (SELECT id FROM u)"
                default:
                    statement = """
                        WITH i AS (INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                                   VALUES ($1, 24.0, 1400, 2200, 1, \(Self.today) - $2::int, now() - make_interval(days => $2::int))
                                   ON CONFLICT (metrics_date, version, user_id) DO NOTHING RETURNING *)
                        INSERT INTO expected SELECT * FROM i
                        """
                }
                let repeatable = writes % 3 == 2
                if repeatable { try connection.execute("BEGIN ISOLATION LEVEL REPEATABLE READ") }
                try connection.query(statement, [user, back])
                if repeatable { try connection.execute("COMMIT") }
                writes += 1
                if writes == 20 {
                    try connection.execute(
                        "DELETE FROM users WHERE id = \(users); DELETE FROM expected WHERE user_id = \(users)")
                }
                usleep(5000)
            }
            return writes
        }
    }

    /// The longest any lock request of this database had waited, sampled every 20 ms until `stop`, in seconds.
    static func longestLockWait(_ url: String, stop: Flag) async throws -> Double {
        try await FaultDatabase(url: url, applicationName: "history-lock-sampler").withConnection { connection in
            var longest = 0.0
            while !stop.isSet {
                let waited =
                    try connection.query(
                        """
                        SELECT coalesce(max(extract(epoch FROM clock_timestamp() - waitstart)), 0)::float8 FROM pg_locks
                        WHERE NOT granted AND pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database())
                        """
                    ).string(0, 0).flatMap(Double.init) ?? 0
                longest = max(longest, waited)
                usleep(20_000)
            }
            return longest
        }
    }
}
