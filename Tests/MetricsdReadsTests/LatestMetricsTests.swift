import Foundation
import HealthMetrics
import Logging
import MetricsdTestSupport
import Synchronization
import Testing

@testable import MetricsdPostgres
@testable import MetricsdReads
@testable import MetricsdWork

/// The read path that replaces `computed_at::date = CURRENT_DATE`.
@Suite struct LatestMetricsTests {
    @Test func newestRowWinsAcrossDatesAndVersions() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(1), SeedUser.valid(2)])
            try await database.execute(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) VALUES
                  (1, 20.0, 1500, 1800, 1, '2026-01-01', '2026-01-01T00:05:00Z'),
                  (1, 21.0, 1510, 1810, 2, '2026-01-02', '2026-01-02T00:05:00.123Z'),
                  (1, 22.0, 1520, 1820, 1, '2026-01-03', '2026-01-02T00:04:00Z'),
                  (2, 30.0, 2000, 2400, 1, '2026-01-05', '2026-01-05T10:00:00Z')
                """)
            let store = PostgresStore(pool: database.pool, formula: .current, logger: database.logger)
            try await store.serving {
                let latest = try #require(try await store.latestMetrics(userID: 1))
                #expect(latest.metrics == ComputedMetrics(bmiTenths: 210, bmr: 1510, tdee: 1810, version: 2))
                #expect(latest.computedAt.iso8601 == "2026-01-02T00:05:00.123Z")
                #expect(latest.acknowledgedAt == nil)
                #expect(try await store.latestMetrics(userID: 3) == nil)
            }
        }
    }

    /// On a history of 100,000+ rows the read is one probe of `profile_metrics_latest`'s primary key (the users'
    /// newest rows, kept by triggers) and never touches the history.
    @Test func latestQueryUsesTheIndex() async throws {
        try await withTestDatabase { database in
            try await database.execute(
                """
                INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 5000) g;
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u, 22.5, 1600, 2000, 1, d::date, d + (u % 3600) * interval '1 second'
                FROM generate_series(1, 5000) u, generate_series('2026-01-01'::timestamptz, '2026-01-21', '1 day') d;
                ANALYZE users; ANALYZE profile_metrics; ANALYZE profile_metrics_latest;
                """)
            #expect(Int(try await database.value("SELECT count(*) FROM profile_metrics") ?? "0")! >= 100_000)
            #expect(try await database.value("SELECT count(*) FROM profile_metrics_latest") == "5000")
            func expectOneProbe(_ plan: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
                #expect(
                    plan.contains("Index Scan using profile_metrics_latest_pkey on profile_metrics_latest"),
                    "\(what):\n\(plan)", sourceLocation: sourceLocation)
                #expect(
                    !plan.contains("Seq Scan on profile_metrics"), "\(what):\n\(plan)", sourceLocation: sourceLocation)
                #expect(
                    !plan.contains("on profile_metrics "), "the history is not read; \(what):\n\(plan)",
                    sourceLocation: sourceLocation)
            }
            let plan = try await database.rows(
                "EXPLAIN " + SQL.latestMetrics.replacingOccurrences(of: "$1", with: "4242")
            )
            .map { $0.first.flatMap { $0 } ?? "" }.joined(separator: "\n")
            expectOneProbe(plan, "plan")
            // The same through a prepared statement (generic plan) as the daemon runs it.
            let generic = try await database.pool.withConnection { connection in
                try connection.execute("SET plan_cache_mode = force_generic_plan")
                try connection.execute("PREPARE latest(bigint) AS " + SQL.latestMetrics)
                let result = try connection.query("EXPLAIN EXECUTE latest(4242)")
                return (0..<result.rowCount).compactMap { result.string($0, 0) }.joined(separator: "\n")
            }
            expectOneProbe(generic, "generic plan")
            // The batched read: one probe per user of the array, never a scan of the table.
            let batch = try await database.pool.withConnection { connection in
                try connection.execute("PREPARE latest_batch(bigint[]) AS " + SQL.latestMetricsBatch)
                let result = try connection.query("EXPLAIN EXECUTE latest_batch('{4242,17,99}')")
                return (0..<result.rowCount).compactMap { result.string($0, 0) }.joined(separator: "\n")
            }
            expectOneProbe(batch, "batch plan")
        }
    }

    /// Concurrent reads are coalesced into batches; each caller still gets its own user's row (or nil), however
    /// the batches fall, with repeated users in one batch and users without metrics among them.
    @Test func concurrentReadsEachGetTheirOwnUsersMetrics() async throws {
        try await withTestDatabase { database in
            try await database.execute(
                """
                INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 300) g;
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u, 20.0 + u / 10.0, 1000 + u, 2000 + u, 1, '2026-01-01', '2026-01-01T00:05:00Z'::timestamptz
                       + u * interval '1 millisecond'
                FROM generate_series(1, 300) u WHERE u % 7 <> 0;
                INSERT INTO metrics_acknowledgements (user_id, version, metrics_computed_at, acknowledged_at)
                SELECT u, 1, '2026-01-01T00:05:00Z'::timestamptz + u * interval '1 millisecond', '2026-01-02T00:00:00Z'
                FROM generate_series(1, 300) u WHERE u % 5 = 0 AND u % 7 <> 0;
                """)
            let store = PostgresStore(pool: database.pool, formula: .current, readRunners: 2, logger: database.logger)
            try await store.serving {
                let requests = (0..<3000).map { Int64($0 % 300 + 1) }.shuffled()
                let answers = try await withThrowingTaskGroup(of: (Int64, LatestMetrics?).self) { group in
                    for userID in requests {
                        group.addTask { (userID, try await store.latestMetrics(userID: userID)) }
                    }
                    return try await group.reduce(into: [(Int64, LatestMetrics?)]()) { $0.append($1) }
                }
                #expect(answers.count == requests.count)
                for (userID, latest) in answers {
                    if userID % 7 == 0 {
                        #expect(latest == nil, "user \(userID) has no metrics")
                        continue
                    }
                    let expected = ComputedMetrics(
                        bmiTenths: 200 + userID, bmr: 1000 + userID, tdee: 2000 + userID, version: 1)
                    #expect(latest?.metrics == expected, "user \(userID)")
                    #expect(latest?.computedAt == Timestamp(millisecondsSinceEpoch: 1_767_225_900_000 + userID))
                    #expect((latest?.acknowledgedAt != nil) == (userID % 5 == 0), "user \(userID)")
                }
            }
        }
    }

    /// Under load one runner runs batch after batch on one connection, and gives the connection back every
    /// `batchesPerConnection` batches: with batches of two and one runner, twenty thousand waiting callers (callbacks,
    /// as the HTTP read uses) span many such turns, and every one is answered with its own user's row, once. A
    /// backend terminated in the middle of the turns costs nobody an answer: the batch it broke runs again on a
    /// fresh connection.
    @Test func oneRunnerDrainsManyBatchesAcrossConnectionsAndALostBackend() async throws {
        try await withTestDatabase { database in
            try await database.execute(
                """
                INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 100) g;
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u, 20.0, 1000 + u, 2000 + u, 1, '2026-01-01', '2026-01-01T00:05:00Z'
                FROM generate_series(1, 100) u WHERE u % 9 <> 0;
                """)
            let batcher = LatestMetricsBatcher(pool: database.pool, maxRunners: 1, maxBatch: 2)
            let service = Task { await batcher.run() }
            defer { service.cancel() }
            let count = 20_000
            let answers = Shared<[Int64: [Int64?]]>([:])
            let failures = Shared<[String]>([])
            let answeredAtTermination = Shared<Int>(-1)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    // Terminates the runner's backend while the callers below are being answered.
                    try await Task.sleep(for: .milliseconds(50))
                    try await database.execute(
                        """
                        SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                        WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
                        """)
                    let answered = answers.withLock { $0.values.map(\.count).reduce(0, +) }
                    answeredAtTermination.withLock { $0 = answered }
                }
                try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
                    let left = Shared<Int>(count)
                    for index in 0..<count {
                        let userID = Int64(index % 100 + 1)
                        batcher.load(userID: userID) { result in
                            switch result {
                            case .success(let latest):
                                answers.withLock {
                                    $0[userID, default: []].append(latest.map { Int64($0.metrics.bmr) })
                                }
                            case .failure(let error): failures.withLock { $0.append("user \(userID): \(error)") }
                            }
                            if left.withLock({
                                $0 -= 1
                                return $0
                            }) == 0 {
                                done.resume()
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            #expect(failures.withLock { $0 } == [])
            let atTermination = answeredAtTermination.withLock { $0 }
            #expect(
                atTermination > 0 && atTermination < count, "the backend was terminated after \(atTermination) answers")
            let all = answers.withLock { $0 }
            #expect(all.values.map(\.count).reduce(0, +) == count)
            for (userID, bmrs) in all {
                let expected: Int64? = userID % 9 == 0 ? nil : 1000 + userID
                #expect(bmrs.allSatisfy { $0 == expected }, "user \(userID): \(bmrs)")
            }
        }
    }

    @Test func justOnboardedUserIsComputedOnTheSpot() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(7, timezone: "Asia/Kathmandu")])
            let store = PostgresStore(pool: database.pool, formula: .current, logger: database.logger)
            try await store.serving {
                #expect(try await store.latestMetrics(userID: 7) == nil)
                guard case .computed(let latest) = try await store.computeNow(userID: 7) else {
                    Issue.record("expected metrics")
                    return
                }
                #expect(try await store.latestMetrics(userID: 7) == latest)
                let date = try await database.value("SELECT metrics_date::text FROM profile_metrics WHERE user_id = 7")
                let localToday = try await database.value("SELECT (now() AT TIME ZONE 'Asia/Kathmandu')::date::text")
                #expect(date == localToday)
            }
        }
    }

    @Test func invalidUserGetsEveryReasonAndASkipRecord() async throws {
        try await withTestDatabase { database in
            var user = SeedUser.valid(9)
            user.height = "72.0"
            user.gender = "robot"
            try await database.seed([user])
            let store = PostgresStore(pool: database.pool, formula: .current, logger: database.logger)
            try await store.serving {
                let outcome = try await store.computeNow(userID: 9)
                #expect(
                    outcome
                        == .skipped([
                            SkipReason(.unknownGender, "gender 'robot' is not one of male, female, other"),
                            SkipReason(.outOfRange, "height 72 cm is outside 100–250 cm"),
                        ]))
                #expect(try await database.value("SELECT source FROM metrics_skips WHERE user_id = 9") == "request")
                #expect(try await store.computeNow(userID: 10) == .unknownUser)
            }
        }
    }
}

/// A value several closures share (a `Mutex` itself cannot be captured).
private final class Shared<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { self.mutex = Mutex(value) }
    func withLock<T>(_ body: (inout Value) -> T) -> T { self.mutex.withLock { body(&$0) } }
}
