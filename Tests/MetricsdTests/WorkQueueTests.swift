import HealthMetrics
import Logging
import MetricsdPostgres
import Testing

@Suite struct WorkQueueTests {
    static func queue(_ database: TestDatabase, owner: String = "w1", formula: MetricsFormula = .current) -> WorkQueue {
        var configuration = WorkQueue.Configuration()
        configuration.batchSize = 7
        configuration.chunkSize = 20
        return WorkQueue(pool: database.pool, formula: formula, owner: owner, configuration: configuration, logger: database.logger)
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
            #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE metrics_date = '2025-10-29'") == "48")
            #expect(try await database.value("SELECT count(*) FROM metrics_skips") == "2")
            #expect(try await database.value("SELECT reasons FROM metrics_skips WHERE user_id = 4") == "height 72 cm is outside 100–250 cm")
            #expect(try await database.value("SELECT state FROM daily_units") == "done")
            // A second run of the day does nothing.
            #expect(try await queue.enqueueDueUnits(dailyAt: .default, now: now).isEmpty)
        }
    }
}
