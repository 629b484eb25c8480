import Foundation
import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdTestSupport
import MetricsdWork
import Synchronization
import Testing

/// Crashes at every step of a chunk, with an injected clock: whatever happens, the final rows are exactly one per
/// (user, date, version), and the work resumes from the last committed batch.
@Suite struct CrashInjectionTests {
    static let start = Timestamp(iso8601: "2026-06-10T12:00:00Z")!

    static func at(_ seconds: Int64) -> Timestamp {
        Timestamp(millisecondsSinceEpoch: Self.start.millisecondsSinceEpoch + seconds * 1000)
    }

    static func queue(_ database: TestDatabase, owner: String, faults: WorkQueue.Faults = .init()) -> WorkQueue {
        var configuration = WorkQueue.Configuration()
        configuration.batchSize = 10
        configuration.chunkSize = 100
        configuration.leaseSeconds = 30
        var queue = WorkQueue(
            pool: database.pool, formula: .current, owner: owner, configuration: configuration, logger: database.logger)
        queue.faults = faults
        return queue
    }

    struct SimulatedCrash: Error {}

    /// Users 1…95 in one zone, valid except every 19th (skipped with a reason).
    static func seed(_ database: TestDatabase) async throws {
        try await database.seed(
            (1...95).map { id in
                var user = SeedUser.valid(Int64(id), timezone: "Europe/Paris")
                if id % 19 == 0 { user.weight = "500.00" }
                return user
            })
    }

    static func assertExactlyOnce(_ database: TestDatabase) async throws {
        #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "90")
        #expect(
            try await database.value(
                "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
            ) == "0")
        #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE user_id % 19 = 0") == "0")
        #expect(try await database.value("SELECT count(*) FROM metrics_skips") == "5")
        #expect(try await database.value("SELECT state FROM daily_units") == "done")
    }

    /// The worker dies after its batch statement and before COMMIT: the server rolls the batch back; after the
    /// lease expires another worker resumes from the last committed cursor.
    @Test func killedBetweenUpsertsAndCommit() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            var faults = WorkQueue.Faults()
            let batches = AtomicCounter()
            faults.beforeCommit = { connection, _ in
                if batches.increment() == 3 {  // two batches committed, the third dies
                    connection.simulateCrash()
                    throw SimulatedCrash()
                }
            }
            let doomed = Self.queue(database, owner: "doomed", faults: faults)
            _ = try await doomed.enqueueDueUnits(dailyAt: .default, now: Self.start)
            let chunk = try #require(try await doomed.claim(now: Self.start))
            await #expect(throws: (any Error).self) { try await doomed.process(chunk, now: Self.start) }
            #expect(
                try await database.value("SELECT count(*) FROM profile_metrics") == "19",
                "only the two committed batches (user 19 is skipped)")
            #expect(
                try await database.value("SELECT cursor_user_id FROM work_chunks WHERE id = $1", [String(chunk.id)])
                    == "20")

            let peer = Self.queue(database, owner: "peer")
            #expect(try await peer.claim(now: Self.at(10)) == nil, "the lease still holds")
            let resumed = try #require(try await peer.claim(now: Self.at(31)))
            #expect(resumed.id == chunk.id)
            #expect(resumed.cursor == 20)
            _ = try await peer.process(resumed, now: Self.at(31))
            try await ScheduleTests.runAll(peer, now: Self.at(31))
            try await Self.assertExactlyOnce(database)
        }
    }

    /// The worker dies right after a COMMIT: that batch stays, nothing is written twice when the peer resumes.
    @Test func killedAfterCommit() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            var faults = WorkQueue.Faults()
            let batches = AtomicCounter()
            faults.afterCommit = { connection, _ in
                if batches.increment() == 5 {
                    connection.simulateCrash()
                    throw SimulatedCrash()
                }
            }
            let doomed = Self.queue(database, owner: "doomed", faults: faults)
            _ = try await doomed.enqueueDueUnits(dailyAt: .default, now: Self.start)
            let chunk = try #require(try await doomed.claim(now: Self.start))
            await #expect(throws: (any Error).self) { try await doomed.process(chunk, now: Self.start) }
            #expect(
                try await database.value("SELECT count(*) FROM profile_metrics") == "48",
                "five batches, two of them with a skipped user")
            let stampBefore = try await database.value("SELECT max(computed_at)::text FROM profile_metrics")

            let peer = Self.queue(database, owner: "peer")
            try await ScheduleTests.runAll(peer, now: Self.at(31))
            try await Self.assertExactlyOnce(database)
            #expect(
                try await database.value(
                    "SELECT count(*) FROM profile_metrics WHERE computed_at::text <= $1", [stampBefore]) == "48",
                "rows of committed batches were not rewritten")
        }
    }

    /// A worker that stalled past its lease finds a peer holding the chunk: its next batch is fenced off and
    /// rolled back, and the peer finishes.
    @Test func expiredLeaseIsFencedOff() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            let slow = Self.queue(database, owner: "slow")
            _ = try await slow.enqueueDueUnits(dailyAt: .default, now: Self.start)
            let chunk = try #require(try await slow.claim(now: Self.start))
            let peer = Self.queue(database, owner: "peer")
            let taken = try #require(try await peer.claim(now: Self.at(40)))
            #expect(taken.id == chunk.id)
            let late = try await slow.process(chunk, now: Self.at(41))
            #expect(late.end == .leaseLost)
            #expect(late.computed == 0)
            #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "0")
            _ = try await peer.process(taken, now: Self.at(41))
            try await ScheduleTests.runAll(peer, now: Self.at(41))
            try await Self.assertExactlyOnce(database)
        }
    }

    /// Two workers race for the chunks of one unit (and of a recompute job): each chunk is held by one of them at
    /// a time, both do work, and every user gets exactly one row.
    @Test func twoWorkersRace() async throws {
        try await withTestDatabase(poolSize: 6) { database in
            try await database.seed((1...2000).map { SeedUser.valid(Int64($0), timezone: "America/Chicago") })
            let first = Self.queue(database, owner: "first")
            let second = Self.queue(database, owner: "second")
            _ = try await first.enqueueDueUnits(dailyAt: .default, now: Self.start)
            _ = try await RecomputeJobs(pool: database.pool, chunkSize: 100).trigger(version: 1, requestedBy: "test")
            async let a = Self.drain(first)
            async let b = Self.drain(second)
            let (countA, countB) = try await (a, b)
            #expect(countA > 0 && countB > 0, "both workers did work: \(countA) and \(countB) chunks")
            #expect(countA + countB == 40)
            #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "2000")
            #expect(
                try await database.value("SELECT sum(attempts) FROM work_chunks") == "40", "no chunk was claimed twice")
        }
    }

    static func drain(_ queue: WorkQueue) async throws -> Int {
        var chunks = 0
        while let chunk = try await queue.claim(now: Self.start) {
            let progress = try await queue.process(chunk, now: Self.start)
            #expect(progress.end == .finished)
            chunks += 1
        }
        return chunks
    }
}

/// A thread-safe counter for fault hooks.
final class AtomicCounter: Sendable {
    private let value = Synchronization.Atomic<Int>(0)
    /// Increments and returns the new value.
    func increment() -> Int { self.value.add(1, ordering: .relaxed).newValue }
    var current: Int { self.value.load(ordering: .relaxed) }
}
