import Foundation
import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdReads
import MetricsdTestSupport
import MetricsdWork
import Synchronization
import Testing

/// Retention (METRICSD_RETENTION_DAYS) as queued work, on a real PostgreSQL: which rows go, which stay, and how the
/// removal shares the queue with other instances, restarts and the rest of the work.
///
/// The scenario: today is 2026-03-02, 12:00 UTC; retention keeps 30 days, so the cutoff is 2026-01-31 12:00 and
/// every row of 2026-01-31 or earlier (computed at its 00:05 UTC) is old.
@Suite struct RetentionTests {
    static let now = Timestamp(iso8601: "2026-03-02T12:00:00Z")!
    static let days = 30
    static let cutoffDate = "2026-01-31"

    static func at(_ seconds: Int64) -> Timestamp {
        Timestamp(millisecondsSinceEpoch: Self.now.millisecondsSinceEpoch + seconds * 1000)
    }

    static func queue(
        _ database: TestDatabase, owner: String = "w1", faults: WorkQueue.Faults = .init(),
        formula: MetricsFormula = .current
    ) -> WorkQueue {
        var configuration = WorkQueue.Configuration()
        configuration.batchSize = 7
        configuration.chunkSize = 20
        var queue = WorkQueue(
            pool: database.pool, formula: formula, owner: owner, configuration: configuration, logger: database.logger)
        queue.faults = faults
        return queue
    }

    /// Users 1–40: a row every day from 2025-12-01 to 2026-03-02 (version 1, computed at 00:05 UTC).
    /// User 41: only 2025-12-01 … 12-10 (stopped using the app). User 42: version 1 until 2026-01-20, version 2
    /// from 2026-01-10 (a formula bump). User 43: 2025-12-01 … 12-10, then back on 2026-03-01 (a day ago).
    /// User 44: no rows.
    static func seed(_ database: TestDatabase) async throws {
        try await database.seed((1...44).map { SeedUser.valid(Int64($0)) })
        try await database.execute(
            """
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
            SELECT u, 24.5, 1650, 2475, v, d::date, d + interval '5 minutes'
            FROM (SELECT u, 1 AS v, d FROM generate_series(1, 40) u,
                    generate_series(timestamptz '2025-12-01', '2026-03-02', interval '1 day') d
                  UNION ALL
                  SELECT 41, 1, d FROM generate_series(timestamptz '2025-12-01', '2025-12-10', interval '1 day') d
                  UNION ALL
                  SELECT 42, 1, d FROM generate_series(timestamptz '2025-12-01', '2026-01-20', interval '1 day') d
                  UNION ALL
                  SELECT 42, 2, d FROM generate_series(timestamptz '2026-01-10', '2026-03-02', interval '1 day') d
                  UNION ALL
                  SELECT 43, 1, d FROM generate_series(timestamptz '2025-12-01', '2025-12-10', interval '1 day') d
                  UNION ALL
                  SELECT 43, 1, timestamptz '2026-03-01') r
            ORDER BY d, u
            """)
    }

    /// What must stay, user by user (dates as text), by the rule: a row computed before the cutoff goes only when
    /// a newer row of its user and version exists that was computed more than three days before now.
    static func expectedRemaining(_ database: TestDatabase) async throws -> [String: String] {
        var expected: [String: String] = [:]
        for user in 1...40 {
            expected["\(user)"] = "v1 2026-02-01..2026-03-02"
        }
        expected["41"] = "v1 2025-12-10"  // the newest row stays: the user keeps their metrics
        expected["42"] = "v1 2026-01-20; v2 2026-02-01..2026-03-02"  // each version's newest stays
        expected["43"] = "v1 2025-12-10, 2026-03-01"  // the newer row is a day old: 12-10 stays until it is 3 days old
        return expected
    }

    /// The rows each user has, summarized as "v1 first..last" runs of consecutive dates.
    static func remaining(_ database: TestDatabase) async throws -> [String: String] {
        let rows = try await database.rows(
            """
            SELECT user_id::text, version, string_agg(
                     CASE WHEN first = last THEN first::text ELSE first::text || '..' || last::text END, ', '
                     ORDER BY first)
            FROM (SELECT user_id, version, min(metrics_date) AS first, max(metrics_date) AS last
                  FROM (SELECT user_id, version, metrics_date,
                               metrics_date - (row_number() OVER (PARTITION BY user_id, version ORDER BY metrics_date))::int AS run
                        FROM profile_metrics) x
                  GROUP BY user_id, version, run) runs
            GROUP BY user_id, version ORDER BY user_id, version
            """)
        var out: [String: String] = [:]
        for row in rows {
            let user = row[0] ?? "?"
            let part = "v\(row[1] ?? "?") \(row[2] ?? "")"
            out[user] = out[user].map { $0 + "; " + part } ?? part
        }
        return out
    }

    /// Claims and processes every chunk there is (retention and other work), then finishes what is complete.
    static func drain(_ queue: WorkQueue, now: Timestamp) async throws -> Int {
        var removed = 0
        while let work = try await queue.claimWork(now: now) {
            switch work {
            case .retention(let chunk):
                let progress = try await queue.process(chunk, now: now)
                removed += progress.removed
                _ = try await queue.finishRetentionRuns(after: chunk, now: now)
            case .users(let chunk):
                _ = try await queue.process(chunk, now: now)
                _ = try await queue.finishCompleted(after: chunk, now: now)
            }
        }
        return removed
    }

    @Test func removesOldRowsButNeverAUsersNewestOfAVersion() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            let total = Int(try await database.value("SELECT count(*) FROM profile_metrics") ?? "") ?? 0
            let queue = Self.queue(database)
            let run = try #require(try await queue.enqueueRetention(days: Self.days, now: Self.now))
            #expect(run.fullPass, "the first run examines every date")
            #expect(run.dates == LocalDate(iso: "2025-12-01")!...LocalDate(iso: "2026-02-01")!)
            #expect(run.chunks == 63)
            #expect(run.cutoff == Timestamp(iso8601: "2026-01-31T12:00:00Z"))
            let removed = try await Self.drain(queue, now: Self.now)
            #expect(try await Self.remaining(database) == (try await Self.expectedRemaining(database)))
            let left = Int(try await database.value("SELECT count(*) FROM profile_metrics") ?? "") ?? 0
            #expect(removed == total - left)
            #expect(try await database.value("SELECT state FROM retention_runs") == "done")
            #expect(
                try await database.value("SELECT sum(rows_removed) FROM work_chunks WHERE kind = 'retention'")
                    == String(removed))
            // Every user who had metrics still has them; the newest row of each is the one it was.
            #expect(try await database.value("SELECT count(DISTINCT user_id) FROM profile_metrics") == "43")
            // A second run right away has nothing to do: none is created until the cutoff moves an hour.
            #expect(try await queue.enqueueRetention(days: Self.days, now: Self.at(60)) == nil)
        }
    }

    /// A worker dies mid-removal (after its batch statement, before COMMIT): the batch rolls back; once the lease
    /// expires another instance resumes the chunk from its last committed cursor and the run ends as if nothing
    /// had happened.
    @Test func aRemovalCutShortIsResumedByAnotherInstance() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            var faults = WorkQueue.Faults()
            let batches = AtomicCounter()
            faults.retentionBeforeCommit = { connection, _ in
                if batches.increment() == 3 {
                    connection.simulateCrash()
                    throw CrashInjectionTests.SimulatedCrash()
                }
            }
            let doomed = Self.queue(database, owner: "doomed", faults: faults)
            _ = try await doomed.enqueueRetention(days: Self.days, now: Self.now)
            guard case .retention(let chunk)? = try await doomed.claimWork(now: Self.now) else {
                Issue.record("no retention chunk to claim")
                return
            }
            #expect(chunk.date == LocalDate(iso: "2025-12-01"))
            await #expect(throws: (any Error).self) { try await doomed.process(chunk, now: Self.now) }
            // Two batches committed (a batch of 7 rows leaves its last user to the next: users 1-6, then 7-12);
            // the third rolled back.
            #expect(
                try await database.value("SELECT cursor_user_id FROM work_chunks WHERE id = $1", [String(chunk.id)])
                    == "12")
            #expect(
                try await database.value("SELECT count(*) FROM profile_metrics WHERE metrics_date = '2025-12-01'")
                    == "31")

            let peer = Self.queue(database, owner: "peer")
            if case .retention(let early)? = try await peer.claimWork(now: Self.at(10)) {
                #expect(early.id != chunk.id, "the dead worker's lease still holds")
                try await peer.release(early, now: Self.at(10))
            }
            _ = try await Self.drain(peer, now: Self.at(61))
            #expect(
                try await database.value("SELECT attempts FROM work_chunks WHERE id = $1", [String(chunk.id)]) == "2")
            #expect(try await Self.remaining(database) == (try await Self.expectedRemaining(database)))
            #expect(try await database.value("SELECT state FROM retention_runs") == "done")
        }
    }

    /// Two instances work through one run at once: each chunk is removed by exactly one of them, and together they
    /// leave exactly what one would.
    @Test func twoInstancesShareOneRun() async throws {
        try await withTestDatabase(poolSize: 6) { database in
            try await Self.seed(database)
            let a = Self.queue(database, owner: "host-a:1:aa")
            let b = Self.queue(database, owner: "host-b:2:bb")
            async let runA = a.enqueueRetention(days: Self.days, now: Self.now)
            async let runB = b.enqueueRetention(days: Self.days, now: Self.now)
            let created = [try await runA, try await runB].compactMap { $0 }
            #expect(created.count == 1, "one run, whichever instance created it")
            // Both hold a chunk before either works: they are different chunks.
            guard case .retention(let first)? = try await a.claimWork(now: Self.now),
                case .retention(let second)? = try await b.claimWork(now: Self.now)
            else {
                Issue.record("no retention chunks to claim")
                return
            }
            #expect(first.id != second.id)
            async let removedA = Self.processThenDrain(a, first)
            async let removedB = Self.processThenDrain(b, second)
            let removed = try await removedA + (try await removedB)
            #expect(try await Self.remaining(database) == (try await Self.expectedRemaining(database)))
            #expect(try await database.value("SELECT sum(rows_removed) FROM work_chunks") == String(removed))
            #expect(
                try await database.value("SELECT count(*) FROM work_chunks WHERE attempts <> 1 OR state <> 'done'")
                    == "0",
                "every chunk was claimed once and finished")
            #expect(try await database.value("SELECT count(DISTINCT lease_owner) FROM work_chunks") == "2")
            #expect(try await database.value("SELECT state FROM retention_runs") == "done")
        }
    }

    static func drain(_ queue: WorkQueue, now: Timestamp, then flag: Flag) async throws -> Int {
        defer { flag.set() }
        return try await Self.drain(queue, now: now)
    }

    static func processThenDrain(_ queue: WorkQueue, _ chunk: RetentionChunk) async throws -> Int {
        let first = try await queue.process(chunk, now: Self.now).removed
        _ = try await queue.finishRetentionRuns(after: chunk, now: Self.now)
        return first + (try await Self.drain(queue, now: Self.now))
    }

    /// While chunks are being removed, the latest read keeps answering every user with their newest row.
    @Test func readsDuringRemovalAnswerEveryUser() async throws {
        try await withTestDatabase(poolSize: 6) { database in
            try await Self.seed(database)
            let store = PostgresStore(pool: database.pool, formula: .current, logger: database.logger)
            try await store.serving {
                var newest: [Int64: Timestamp] = [:]
                for user in Int64(1)...43 {
                    newest[user] = try #require(try await store.latestMetrics(userID: user)).computedAt
                }
                let queue = Self.queue(database)
                _ = try await queue.enqueueRetention(days: Self.days, now: Self.now)
                let done = Flag()
                async let removal = Self.drain(queue, now: Self.now, then: done)
                var reads = 0
                var problems: [String] = []
                repeat {
                    for user in Int64(1)...43 {
                        let latest = try await store.latestMetrics(userID: user)
                        reads += 1
                        if latest?.computedAt != newest[user] {
                            problems.append("user \(user): \(latest.map { "\($0.computedAt)" } ?? "no metrics")")
                        }
                    }
                } while !done.isSet
                #expect(try await removal > 0)
                #expect(problems.isEmpty, "\(problems.prefix(5))")
                #expect(reads >= 43)
            }
        }
    }

    /// A removal in progress holds only the locks of the rows it removes: a daily unit of the same users runs to
    /// its end while a retention batch's transaction is still open.
    @Test func theDailyUnitDoesNotWaitOnARemoval() async throws {
        try await withTestDatabase(poolSize: 6) { database in
            try await Self.seed(database)
            let dailyDone = Flag()
            var faults = WorkQueue.Faults()
            faults.retentionBeforeCommit = { _, _ in
                // Keep the batch's transaction open until the daily unit is done (or 20 s have passed).
                for _ in 0..<400 where !dailyDone.isSet { usleep(50_000) }
            }
            let remover = Self.queue(database, owner: "remover", faults: faults)
            let daily = Self.queue(database, owner: "daily")
            _ = try await remover.enqueueRetention(days: Self.days, now: Self.now)
            guard case .retention(let chunk)? = try await remover.claimWork(now: Self.now) else {
                Issue.record("no retention chunk to claim")
                return
            }
            async let removal = remover.process(chunk, now: Self.now)
            // 2026-03-03 00:05 UTC: every user's daily unit for 03-03 falls due.
            let dueNow = Timestamp(iso8601: "2026-03-03T00:06:00Z")!
            try await Task.sleep(for: .milliseconds(200))
            let started = ContinuousClock.now
            #expect(try await daily.enqueueDueUnits(dailyAt: .default, now: dueNow).count == 1)
            while let work = try await daily.claim(now: dueNow) {
                _ = try await daily.process(work, now: dueNow)
            }
            let waited = ContinuousClock.now - started
            dailyDone.set()
            _ = try await removal
            #expect(waited < .seconds(15), "the daily unit waited \(waited) for the removal's transaction")
            #expect(
                try await database.value("SELECT count(*) FROM profile_metrics WHERE metrics_date = '2026-03-03'")
                    == "44")
        }
    }

    /// Daily work waiting makes a retention chunk hand itself back after its current batch; the next claim takes
    /// the daily chunk, and the retention chunk resumes from its cursor afterwards.
    @Test func retentionYieldsToDailyWork() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            let queue = Self.queue(database)
            let dueNow = Timestamp(iso8601: "2026-03-03T00:06:00Z")!
            _ = try await queue.enqueueRetention(days: Self.days, now: dueNow)
            guard case .retention(let chunk)? = try await queue.claimWork(now: dueNow) else {
                Issue.record("no retention chunk to claim")
                return
            }
            #expect(try await queue.enqueueDueUnits(dailyAt: .default, now: dueNow).count == 1)
            let progress = try await queue.process(chunk, now: dueNow)
            #expect(progress.end == .yielded)
            #expect(progress.batches == 1)
            #expect(
                try await database.value(
                    "SELECT state || ' ' || cursor_user_id FROM work_chunks WHERE id = $1", [String(chunk.id)])
                    == "pending 6")
            guard case .users(let next)? = try await queue.claimWork(now: dueNow) else {
                Issue.record("the daily chunk was not claimed first")
                return
            }
            #expect(next.conflictIsDaily)
            _ = try await queue.process(next, now: dueNow)
            _ = try await Self.drain(queue, now: dueNow)
            #expect(try await database.value("SELECT state FROM retention_runs") == "done")
        }
    }

    /// One run at a time; the next when the cutoff has moved an hour, over the dates since the last cutoff; every
    /// date again a week after the last full pass.
    @Test func runsAreIncrementalWithAWeeklyFullPass() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            let queue = Self.queue(database)
            let first = try #require(try await queue.enqueueRetention(days: Self.days, now: Self.now))
            #expect(try await queue.enqueueRetention(days: Self.days, now: Self.at(7200)) == nil, "one run at a time")
            _ = try await Self.drain(queue, now: Self.now)
            #expect(
                try await queue.enqueueRetention(days: Self.days, now: Self.at(1800)) == nil,
                "the cutoff moved 30 minutes")
            let second = try #require(try await queue.enqueueRetention(days: Self.days, now: Self.at(7200)))
            #expect(!second.fullPass)
            #expect(second.dates == LocalDate(iso: "2026-01-29")!...LocalDate(iso: "2026-02-01")!)
            #expect(second.id > first.id)
            _ = try await Self.drain(queue, now: Self.at(7200))
            let weekLater = Self.at(7 * 86400 + 60)
            let third = try #require(try await queue.enqueueRetention(days: Self.days, now: weekLater))
            #expect(third.fullPass)
            #expect(third.dates?.lowerBound == LocalDate(iso: "2025-12-10"), "the oldest row left is user 41's newest")
            _ = try await Self.drain(queue, now: weekLater)
            // A week on, user 43's 2025-12-10 row has a newer row more than three days old: it goes now.
            #expect(
                try await database.value(
                    "SELECT string_agg(metrics_date::text, ',') FROM profile_metrics WHERE user_id = 43")
                    == "2026-03-01")
            let status = try await StatusQueries(pool: database.pool).retention(days: Self.days, now: weekLater)
            #expect(status.latest?.id == third.id)
            #expect(status.latest?.state == "done")
            #expect(status.behindSeconds < 1)
        }
    }
}

/// A flag one task sets and another polls.
final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { self.value.store(true, ordering: .releasing) }
    var isSet: Bool { self.value.load(ordering: .acquiring) }
}

extension ClaimedChunk {
    var conflictIsDaily: Bool {
        if case .daily = self.kind { return true }
        return false
    }
}
