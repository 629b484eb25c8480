import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdTestSupport
import MetricsdWork
import Testing

@Suite struct WorkQueueTests {
    static func queue(_ database: TestDatabase, owner: String = "w1", formula: MetricsFormula = .current) -> WorkQueue {
        var configuration = WorkQueue.Configuration()
        configuration.batchSize = 7
        configuration.chunkSize = 20
        return WorkQueue(
            pool: database.pool, formula: formula, owner: owner, configuration: configuration, logger: database.logger)
    }

    @Test func dailyUnitComputesEveryValidUserOnce() async throws {
        try await withTestDatabase { database in
            var users = (1...50).map { SeedUser.valid(Int64($0), timezone: "Asia/Kathmandu") }
            users[3].height = "72.0"
            users[4].hasSettings = false
            try await database.seed(users)
            let queue = Self.queue(database)
            let now = Timestamp(iso8601: "2025-10-28T18:25:00Z")!  // 00:10 on 10-29 in Kathmandu (+05:45)
            let units = try await queue.enqueueDueUnits(dailyAt: .default, now: now)
            #expect(units == [.init(timezone: "Asia/Kathmandu", localDate: LocalDate(iso: "2025-10-29")!, chunks: 3)])
            var processed = 0
            while let chunk = try await queue.claim(now: now) {
                let progress = try await queue.process(chunk, now: now)
                #expect(progress.end == .finished)
                processed += progress.computed + progress.skipped
            }
            #expect(processed == 50)
            let finished = try await queue.finishCompleted(now: now)
            #expect(finished.count == 1)
            #expect(
                try await database.value("SELECT count(*) FROM profile_metrics WHERE metrics_date = '2025-10-29'")
                    == "48")
            #expect(try await database.value("SELECT count(*) FROM metrics_skips") == "2")
            #expect(
                try await database.value("SELECT reasons FROM metrics_skips WHERE user_id = 4")
                    == "height 72 cm is outside 100–250 cm")
            #expect(try await database.value("SELECT state FROM daily_units") == "done")
            // A second run of the day does nothing.
            #expect(try await queue.enqueueDueUnits(dailyAt: .default, now: now).isEmpty)
        }
    }

    /// A database a newer metricsd migrated (it has a migration this build does not know): this build creates no
    /// unit, claims no chunk and refreshes no user, and does all three again once the schema is one it knows.
    @Test func aNewerSchemaStopsThisBuildsWork() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...10).map { SeedUser.valid(Int64($0), timezone: "Asia/Kathmandu") })
            let queue = Self.queue(database)
            let now = Timestamp(iso8601: "2025-10-28T18:25:00Z")!  // 00:10 on 10-29 in Kathmandu (+05:45)
            #expect(try await queue.enqueueDueUnits(dailyAt: .default, now: now).count == 1)
            try await database.seed([SeedUser.valid(11, timezone: "UTC")])  // due too: 18:25 UTC is past 00:05
            try await database.execute(
                "INSERT INTO metricsd_migrations (name, checksum) VALUES ('9999_newer.sql', 'newer')")

            #expect(try await queue.claim(now: now) == nil)
            #expect(try await queue.enqueueDueUnits(dailyAt: .default, now: now).isEmpty)
            #expect(try await queue.refreshUsers([1, 11], now: now) == 0)
            #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "0")
            #expect(try await database.value("SELECT count(*) FROM work_chunks WHERE lease_owner IS NOT NULL") == "0")

            try await database.execute("DELETE FROM metricsd_migrations WHERE name = '9999_newer.sql'")
            #expect(try await queue.refreshUsers([11], now: now) == 1)
            #expect(try await queue.enqueueDueUnits(dailyAt: .default, now: now).map(\.timezone) == ["UTC"])
            #expect(try await queue.claim(now: now) != nil)
        }
    }

    /// A claim names the instance whose expired lease it takes over; a chunk handed back on shutdown or after a
    /// failure is no takeover. The unit records its due instant, and its end reports the delay and the counts.
    @Test func takeoversDueInstantAndCounts() async throws {
        try await withTestDatabase { database in
            var users = (1...50).map { SeedUser.valid(Int64($0), timezone: "Asia/Kathmandu") }
            users[3].height = "72.0"
            users[4].hasSettings = false
            try await database.seed(users)
            let a = Self.queue(database, owner: "host-a:1:aa")
            let b = Self.queue(database, owner: "host-b:2:bb")
            let now = Timestamp(iso8601: "2025-10-28T18:25:00Z")!  // 00:10 on 10-29 in Kathmandu (+05:45)
            func at(_ seconds: Int64) -> Timestamp {
                Timestamp(millisecondsSinceEpoch: now.millisecondsSinceEpoch + seconds * 1000)
            }
            _ = try await a.enqueueDueUnits(dailyAt: .default, now: now)
            // 00:05 in Kathmandu on 10-29 is 18:20 UTC on 10-28.
            #expect(
                try await database.value(
                    "SELECT to_char(due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') FROM daily_units")
                    == "2025-10-28 18:20:00")

            let first = try #require(try await a.claim(now: now))
            #expect(first.takenOverFrom == nil)
            // A's lease (60 s) expires: B takes the chunk over.
            let taken = try #require(try await b.claim(now: at(61)))
            #expect(taken.id == first.id)
            #expect(taken.takenOverFrom == "host-a:1:aa")
            // B hands it back (shutdown): A's next claim is no takeover.
            try await b.release(taken, now: at(62))
            let handedBack = try #require(try await a.claim(now: at(63)))
            #expect(handedBack.id == first.id && handedBack.takenOverFrom == nil)
            // A fails on it: after the backoff, B's claim is a retry, no takeover.
            try await a.fail(handedBack, error: "test", now: at(64))
            let retried = try #require(try await b.claim(now: at(400)))
            #expect(retried.id == first.id && retried.takenOverFrom == nil)

            _ = try await b.process(retried, now: at(400))
            while let chunk = try await b.claim(now: at(400)) { _ = try await b.process(chunk, now: at(400)) }
            let finished = try await b.finishCompleted(now: at(400))
            let counts = WorkCounts(total: 50, written: 48, alreadyCurrent: 0, skipped: 2)
            // Due at 18:20:00, done at 18:31:40.
            #expect(
                finished == [
                    .unit(
                        timezone: "Asia/Kathmandu", localDate: LocalDate(iso: "2025-10-29")!, version: 1,
                        counts: counts,
                        seconds: 400, delaySeconds: 700)
                ])
        }
    }
}
