import Foundation
import HealthMetrics
import MetricsdTestSupport
import Testing

@testable import MetricsdPostgres
@testable import MetricsdReads
@testable import MetricsdWork

/// The history read (`GET /v1/profile/metrics/history`): one range scan of the user's own rows, whatever the range.
@Suite struct HistoryQueryTests {
    /// 3,000 users with a row every fifth day over the last two years (in the monthly partitions, the older ones
    /// in the default partition as an upgraded install keeps them), analysed.
    static let seed = """
        SELECT metricsd_add_partitions((current_date + interval '1 month')::date);
        INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 3000) g;
        INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
        SELECT u, 20 + (u * d) % 90 / 10.0, 1400 + (u + d) % 600, 1800 + (u * 13 + d) % 1200, 1,
               current_date - d * 5, (current_date - d * 5)::timestamptz + interval '5 minutes'
        FROM generate_series(0, 146) d CROSS JOIN generate_series(1, 3000) u
        ORDER BY d, u;
        ANALYZE;
        """

    /// A 90-day and a 730-day range, planned for their values as the store sends the statement (unprepared): each
    /// partition it reads is read through the user's entries of the read index (never a scan of a partition, never
    /// the date-first key that holds every user's rows of a date), and the 90-day range reads only the partitions
    /// of the months it covers.
    @Test func eachRangeReadsOnlyTheUsersEntries() async throws {
        try await withTestDatabase { database in
            try await database.execute(Self.seed)
            let today = try #require(try await database.value("SELECT current_date::text"))
            for days in [90, 730] {
                let from = try #require(try await database.value("SELECT (current_date - \(days - 1))::text"))
                let what = "\(days) days"
                let plan = try await database.plan(
                    SQL.historyRange, parameters: ["1234", "1", from, today, "732"], generic: false)
                #expect(plan.contains("_user_computed_at_idx"), "\(what):\n\(plan)")
                #expect(!plan.contains("Seq Scan on profile_metrics"), "\(what):\n\(plan)")
                #expect(!plan.contains("date_version_user_key"), "\(what):\n\(plan)")
                if days == 90 {
                    let partitions = plan.split(separator: "\n").filter {
                        $0.contains("Index Scan") && $0.contains("_user_computed_at_idx")
                    }.count
                    #expect(partitions <= 5, "a 90-day range reads \(partitions) partitions:\n\(plan)")
                }
            }
            let analysed = try await database.rows(
                "EXPLAIN (ANALYZE, BUFFERS) "
                    + SQL.historyRange.replacingOccurrences(of: "$1", with: "1234")
                    .replacingOccurrences(of: "$2", with: "1").replacingOccurrences(
                        of: "$3::date", with: "('\(today)'::date - 729)"
                    )
                    .replacingOccurrences(of: "$4::date", with: "'\(today)'::date").replacingOccurrences(
                        of: "$5", with: "732"))
            let text = analysed.compactMap { $0.first ?? nil }.joined(separator: "\n")
            #expect(text.contains("rows=146 loops=1"), "the user's 146 rows of the 730 days, and no others:\n\(text)")
        }
    }

    /// The recent range's prepared statement: its generic plan (the one a prepared statement keeps after its first
    /// executions, which knows neither the user nor the dates) reads the user's entries of the read index in each
    /// month that holds rows, never the date-first key; run, it returns the user's rows of the range and no others.
    /// (The months before the range are pruned at execution, from the lower bound; this seed keeps them all in
    /// one partition, as an upgraded install does before its history is moved.)
    @Test func theRecentRangesGenericPlanReadsOnlyTheUsersEntries() async throws {
        try await withTestDatabase { database in
            try await database.execute(Self.seed)
            let today = try #require(try await database.value("SELECT current_date::text"))
            let from = try #require(try await database.value("SELECT (current_date - 89)::text"))
            let plan = try await database.plan(
                SQL.historyRecent, parameters: ["1234", "1", from, today, "101"], generic: true, analyze: true)
            #expect(plan.contains("_user_computed_at_idx"), "\(plan)")
            #expect(!plan.contains("date_version_user_key"), "\(plan)")
            // Scanned whole: only the partitions that hold no row (the months made ahead, the default).
            for line in plan.split(separator: "\n") where line.contains("Seq Scan on profile_metrics") {
                #expect(line.hasSuffix("rows=0 loops=1)"), "a partition with rows scanned whole:\n\(plan)")
            }
            // Every fifth day: the 18 rows of the last 90 days (today's included).
            #expect(plan.contains("rows=18 loops=1"), "\(plan)")
        }
    }

    /// The store's paging: every row of the range exactly once, oldest first; a cursor outside the range and a
    /// range longer than two years are refused; an unknown user is told apart from an empty history.
    @Test func pagesCoverTheRangeOnce() async throws {
        try await withTestDatabase { database in
            try await database.execute(Self.seed)
            let store = PostgresStore(pool: database.pool, formula: .current, logger: database.logger)
            let todayText = try #require(try await database.value("SELECT current_date::text"))
            let today = try #require(LocalDate(iso: todayText))
            let from = try #require(today.adding(days: -729))
            var dates: [LocalDate] = []
            var resume: LocalDate?
            repeat {
                let query = HistoryQuery(from: from, to: nil, version: 1, resumeAt: resume, limit: 40)
                guard case .page(let page) = try await store.history(userID: 77, query: query) else {
                    Issue.record("no page")
                    return
                }
                #expect(page.from == from && page.to == today)
                dates += page.entries.map(\.date)
                resume = page.next
            } while resume != nil && dates.count < 1000
            #expect(dates.count == 146, "rows every fifth day in 730 days")
            #expect(dates == dates.sorted() && Set(dates).count == dates.count)
            let tooLong = HistoryQuery(from: today.adding(days: -731), to: nil, version: 1, resumeAt: nil, limit: 10)
            #expect(
                try await store.history(userID: 77, query: tooLong)
                    == .badRange(from: today.adding(days: -731)!, to: today))
            let outside = HistoryQuery(from: from, to: nil, version: 1, resumeAt: today.adding(days: 1), limit: 10)
            #expect(try await store.history(userID: 77, query: outside) == .cursorOutsideRange(today.adding(days: 1)!))
            #expect(try await store.history(userID: 9_999, query: tooLong) == .unknownUser)
            guard
                case .page(let none) = try await store.history(
                    userID: 77, query: .init(from: nil, to: nil, version: 1, resumeAt: nil, limit: 10))
            else {
                Issue.record("no page")
                return
            }
            #expect(none.entries.count == 10 && none.from == today.adding(days: -89))
        }
    }
}
