import Foundation
import HealthMetrics
import Logging
import MetricsdTestSupport
import MetricsdWork
import Testing

@testable import MetricsdPostgres

/// `profile_metrics` partitioned by month of `metrics_date`: an existing history becomes the partition of every
/// older date without being copied, later months get partitions of their own ahead of time, a date no partition
/// covers goes into the default one and moves when its month's partition is made, and every write still keeps
/// the keys, the foreign key and the latest table.
@Suite struct PartitionTests {
    /// A history written before the migrations: the table becomes the partition of every date before the month
    /// after next (the bound 0013 sets and 0014 proves), then of every date up to its newest (0017 to 0019), with
    /// its rows, file, ids, indexes and foreign key; the
    /// identity goes on after its last id; the months after it have partitions two months ahead; the latest table
    /// is kept as it was and kept up to date afterwards.
    @Test func theMigrationKeepsAnExistingHistoryInPlace() async throws {
        let (name, url) = try await MigrationTests.freshDatabase()
        defer { Task { await MigrationTests.drop(name) } }
        let earlier = Migration.all.filter { $0.name < "0013" }
        #expect(earlier.last?.name.hasPrefix("0012_") == true)
        _ = try await MigrationTests.migrate(url, migrator: Migrator(migrations: earlier))
        let database = FaultDatabase(url: url)
        try await database.execute(
            """
            INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 200) g;
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
            SELECT u, 20 + (d % 7), 1500 + d, 1900 + u, 1, (now() AT TIME ZONE 'UTC')::date - d,
                   now() - interval '1 day' * d
            FROM generate_series(1, 200) u CROSS JOIN generate_series(0, 60) d;
            """)
        let before = try await database.value(
            "SELECT count(*) || ' ' || max(id) || ' ' || sum(bmr) || ' ' || pg_relation_filenode('profile_metrics') FROM profile_metrics"
        )
        let keptBefore = try await database.value(HistoryQueries.kept)
        #expect(try await MigrationTests.migrate(url) == Migration.all.filter { $0.name >= "0013" }.map(\.name))

        // The same rows, in the same file (attached, not copied), as the partition of every older date: closed
        // after the newest one (today) by 0017 to 0019, which found it bound at the month after next.
        let closedAt = try #require(try await database.value("SELECT ((now() AT TIME ZONE 'UTC')::date + 1)::text"))
        let old = try #require(
            try await database.value(
                "SELECT replace(metricsd_partition_name('\(closedAt)'), 'profile_metrics_', 'profile_metrics_until_')"))
        let (count, lastID, bmr, filenode) = try Self.four(before)
        #expect(
            try await database.value(
                "SELECT count(*) || ' ' || max(id) || ' ' || sum(bmr) || ' ' || pg_relation_filenode('\(old)') FROM profile_metrics"
            )
                == "\(count) \(lastID) \(bmr) \(filenode)")
        let bounds = try #require(try await database.value(HistoryQueries.partitions)).split(separator: "\n").map(
            String.init)
        #expect(bounds.contains("\(old) FOR VALUES FROM (MINVALUE) TO ('\(closedAt)')"), "\(bounds)")
        #expect(bounds.contains("profile_metrics_default DEFAULT"), "\(bounds)")
        #expect(
            try await database.value(
                """
                SELECT max(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([0-9-]+)''\\)')::date)
                       > (now() + interval '2 months')::date
                FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'profile_metrics'::regclass
                """) == "t", "the partitions reach two months ahead: \(bounds)")
        #expect(
            try await database.value(
                "SELECT count(*) FROM pg_constraint WHERE conname IN ('profile_metrics_dates_before_partitions', 'profile_metrics_dates_before_bound')"
            ) == "0",
            "the bounds' constraints, which the partition's range replaces, are gone")
        // Its indexes are the partitioned indexes' parts, valid; nothing is left unattached.
        #expect(
            try await database.value(
                """
                SELECT count(*) FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indexrelid
                WHERE i.indrelid = '\(old)'::regclass AND i.indisvalid
                """) == "2")
        #expect(try await database.value("SELECT count(*) FROM pg_index WHERE NOT indisvalid") == "0")
        #expect(try await database.value(HistoryQueries.kept) == keptBefore)

        // New rows: ids after the last, the latest table kept, the key and the foreign key enforced.
        let inserted = try await database.value(
            """
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date)
            VALUES (1, 30.0, 1700, 2500, 1, (now() AT TIME ZONE 'UTC')::date + 40) RETURNING id
            """)
        #expect(Int(inserted ?? "") ?? 0 > Int(lastID) ?? .max)
        #expect(try await database.value("SELECT metrics_id FROM profile_metrics_latest WHERE user_id = 1") == inserted)
        #expect(try await database.value(HistoryQueries.kept) == database.value(HistoryQueries.fromHistory))
        await #expect(throws: (any Error).self, "a second row of the same key") {
            try await database.execute(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date)
                VALUES (1, 31.0, 1700, 2500, 1, (now() AT TIME ZONE 'UTC')::date + 40)
                """)
        }
        await #expect(throws: (any Error).self, "a row of an unknown user") {
            try await database.execute(
                "INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date) VALUES (999, 30.0, 1700, 2500, 1, now()::date)"
            )
        }
        try await database.execute("DELETE FROM users WHERE id = 2")
        #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE user_id = 2") == "0")
        #expect(try await database.value(HistoryQueries.kept) == database.value(HistoryQueries.fromHistory))
    }

    /// `addMonthlyPartitions` (start-up and hourly): the months up to two ahead, once, whatever the number of
    /// instances calling it at once. A row dated where no partition was yet goes into the default partition and
    /// moves into its month's partition when that is made; the latest table still names it.
    @Test func monthsAheadAreAddedOnceAndTakeTheirRowsFromTheDefault() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            let queue = WorkQueue(pool: database.pool, formula: .current, owner: "w1", logger: database.logger)
            #expect(try await queue.addMonthlyPartitions() == 0, "the migration made them")
            let ahead = try await database.value(
                """
                SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'profile_metrics'::regclass
                  AND (substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([0-9-]+)''\\)'))::date
                      > (now() + interval '2 months')::date
                """)
            #expect(ahead == "1", "the last partition covers two months from now")

            // A row a year ahead has no partition: it goes into the default one.
            let far = "(date_trunc('month', now()) + interval '12 months')::date + 3"
            let id = try #require(
                try await database.value(
                    "INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date) VALUES (2, 25.0, 1600, 2100, 1, \(far)) RETURNING id"
                ))
            #expect(
                try await database.value("SELECT tableoid::regclass::text FROM profile_metrics WHERE id = \(id)")
                    == "profile_metrics_default")

            // Four callers at once make the months up to it, each once; the row moves to its month.
            let made = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<4 {
                    group.addTask {
                        Int(try await database.value("SELECT metricsd_add_partitions(\(far))") ?? "") ?? -1
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(made.reduce(0, +) == 10, "months 3 to 12 ahead, once each: \(made)")
            #expect(made.filter { $0 > 0 }.count == 1, "one caller made them all: \(made)")
            let month = try #require(try await database.value("SELECT to_char(\(far), 'YYYY_MM')"))
            #expect(
                try await database.value("SELECT tableoid::regclass::text FROM profile_metrics WHERE id = \(id)")
                    == "profile_metrics_\(month)")
            #expect(try await database.value("SELECT count(*) FROM profile_metrics_default") == "0")
            #expect(try await database.value("SELECT metrics_id FROM profile_metrics_latest WHERE user_id = 2") == id)
            #expect(try await database.value("SELECT count(*) FROM pg_index WHERE NOT indisvalid") == "0")
            // Each new partition has the keys, under names that say which partition they belong to.
            #expect(
                try await database.value(
                    """
                    SELECT string_agg(indexrelid::regclass::text, ',' ORDER BY indexrelid::regclass::text) FROM pg_index
                    WHERE indrelid = 'profile_metrics_\(month)'::regclass
                    """)
                    == "profile_metrics_\(month)_date_version_user_key,profile_metrics_\(month)_pkey,profile_metrics_\(month)_user_computed_at_idx"
            )
        }
    }

    /// A day's rows go into their month's partition, and a write touches only that one: the daily unit's upsert
    /// plans (for a date given as a parameter) prune every other partition.
    @Test func aDaysRowsGoIntoTheirMonthsPartitionOnly() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            // A date three months ahead, whose month has a partition of its own, as a constant (the planner prunes
            // by constants; the executor by parameters).
            _ = try await database.value(
                "SELECT metricsd_add_partitions((date_trunc('month', now()) + interval '4 months')::date)")
            let day = try #require(
                try await database.value("SELECT (date_trunc('month', now()) + interval '3 months')::date + 4"))
            let next = "'\(day)'::date"
            let month = try #require(try await database.value("SELECT to_char(\(next), 'YYYY_MM')"))
            try await database.execute(
                "INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date) VALUES (1, 25.0, 1600, 2100, 1, \(next))"
            )
            #expect(
                try await database.value("SELECT tableoid::regclass::text FROM profile_metrics")
                    == "profile_metrics_\(month)")
            let plan = try await database.rows(
                "EXPLAIN SELECT 1 FROM profile_metrics WHERE user_id = 1 AND metrics_date = \(next) AND version = 1"
            )
            .compactMap { $0.first ?? nil }.joined(separator: "\n")
            #expect(plan.contains("profile_metrics_\(month)_"), "plan:\n\(plan)")
            #expect(!plan.contains("profile_metrics_default"), "plan:\n\(plan)")
            #expect(!plan.contains("profile_metrics_until_"), "plan:\n\(plan)")
        }
    }

    /// The months retention empties give their space back (`metricsd_truncate_empty_partitions`): a month that
    /// ended before the date given, holds no row and whose heap VACUUM has cut down is truncated (its heap and
    /// indexes back to their empty size); a month that still holds rows, a month not over by that date, and an
    /// empty month whose heap VACUUM has not cut down yet (more than 128 pages: the check would read it under the
    /// lock) are left as they are; the latest table is not touched (truncating a partition does not fire the
    /// history's own TRUNCATE trigger).
    @Test func anEmptiedMonthIsTruncatedAndNothingElse() async throws {
        try await withTestDatabase { database in
            func month(_ k: Int) -> String { "(date_trunc('month', now()) + interval '\(k) months')::date" }
            _ = try await database.value("SELECT metricsd_add_partitions(\(month(6)))")
            try await database.execute(
                "INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1000, 1599) g")
            // Months 3 and 4 ahead: 28 days of 200 users each; month 5: 28 days of 600 users (more than 128 pages).
            for (k, last) in [(3, 1199), (4, 1199), (5, 1599)] {
                try await database.execute(
                    """
                    INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                    SELECT u, 25.0, 1600, 2100, 1, \(month(k)) + d, now() - interval '1 minute' * (d + 100 * \(k))
                    FROM generate_series(1000, \(last)) u CROSS JOIN generate_series(0, 27) d
                    """)
            }
            var name: [Int: String] = [:]
            for k in 3...5 {
                name[k] =
                    "profile_metrics_"
                    + (try #require(try await database.value("SELECT to_char(\(month(k)), 'YYYY_MM')")))
            }
            let (m3, m4, m5) = (name[3]!, name[4]!, name[5]!)
            func sizes(_ table: String) async throws -> String? {
                try await database.value(
                    """
                    SELECT pg_relation_size('\(table)') || ' ' || string_agg(pg_relation_size(indexrelid)::text, ' ' ORDER BY indexrelid)
                    FROM pg_index WHERE indrelid = '\(table)'::regclass
                    """)
            }
            // Through profile_metrics, as retention deletes (its statement triggers keep the latest table).
            try await database.execute(
                "DELETE FROM profile_metrics WHERE metrics_date >= \(month(3)) AND metrics_date < \(month(4))")
            try await database.execute("VACUUM \(m3)")
            try await database.execute(
                "DELETE FROM profile_metrics WHERE metrics_date >= \(month(5)) AND metrics_date < \(month(6))")
            #expect(try await database.value(HistoryQueries.kept) == database.value(HistoryQueries.fromHistory))
            let m4Before = try await sizes(m4)
            let m5Before = try #require(try await sizes(m5))
            #expect(Int(m5Before.split(separator: " ")[0]) ?? 0 > 128 * 8192, "month 5's heap: \(m5Before)")
            let emptied = try #require(try await sizes(m3))
            #expect(emptied.hasPrefix("0 "), "VACUUM cut month 3's heap down: \(emptied)")
            #expect(
                emptied.split(separator: " ").dropFirst().allSatisfy { (Int($0) ?? 0) > 8192 },
                "its indexes keep their pages: \(emptied)")

            // Not over by the date given: left.
            #expect(try await database.value("SELECT metricsd_truncate_empty_partitions(\(month(4)) - 1)") == "0")
            #expect(try await sizes(m3) == emptied)

            #expect(try await database.value("SELECT metricsd_truncate_empty_partitions(\(month(6)))") == "1")
            #expect(try await sizes(m3) == "0 8192 8192 8192", "month 3 back to its empty size")
            #expect(try await sizes(m4) == m4Before)
            #expect(try await database.value("SELECT count(*) FROM \(m4)") == "5600")
            #expect(try await sizes(m5) == m5Before, "month 5's heap is not read under the lock before VACUUM")
            #expect(try await database.value(HistoryQueries.kept) == database.value(HistoryQueries.fromHistory))
            #expect(try await database.value("SELECT count(*) FROM profile_metrics_latest") == "200")

            // Once VACUUM has cut month 5's heap down, the next call truncates it too.
            try await database.execute("VACUUM \(m5)")
            #expect(try await database.value("SELECT metricsd_truncate_empty_partitions(\(month(6)))") == "1")
            #expect(try await sizes(m5) == "0 8192 8192 8192")
            #expect(
                try await database.value("SELECT metricsd_truncate_empty_partitions(\(month(6)))") == "0",
                "nothing left to give back")
            #expect(try await database.value(HistoryQueries.kept) == database.value(HistoryQueries.fromHistory))
        }
    }

    /// What the scheduler calls with retention on: the months that ended more than `retentionDays` and a day
    /// before the clock. A month emptied of its rows is truncated once the clock is far enough past it, not before.
    @Test func retentionTruncatesAMonthOnlyOnceItIsPastTheCutoff() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            let queue = WorkQueue(pool: database.pool, formula: .current, owner: "w1", logger: database.logger)
            let first = "(date_trunc('month', now()) + interval '3 months')::date"
            _ = try await database.value(
                "SELECT metricsd_add_partitions((date_trunc('month', now()) + interval '5 months')::date)")
            let name =
                "profile_metrics_" + (try #require(try await database.value("SELECT to_char(\(first), 'YYYY_MM')")))
            try await database.execute(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT 1, 25.0, 1600, 2100, 1, \(first) + d, now() - interval '1 day' FROM generate_series(0, 27) d
                """)
            try await database.execute(
                "DELETE FROM profile_metrics WHERE metrics_date >= \(first) AND metrics_date < \(first) + 28")
            try await database.execute("VACUUM \(name)")
            // The month ends on the first of the month after; 10 days of retention, and the clock on that first, 10 or
            // 12 days after it.
            let end = try #require(try await database.value("SELECT (\(first) + interval '1 month')::date"))
            let endNoon = try #require(Timestamp(iso8601: "\(end)T12:00:00Z")).millisecondsSinceEpoch
            func clock(_ days: Int64) -> Timestamp { Timestamp(millisecondsSinceEpoch: endNoon + days * 86_400_000) }
            #expect(
                try await queue.truncateEmptiedPartitions(retentionDays: 10, now: clock(10)) == 0,
                "the cutoff's date less a day is before the month's end")
            #expect(try await queue.truncateEmptiedPartitions(retentionDays: 10, now: clock(12)) == 1)
            #expect(
                try await database.value("SELECT pg_relation_size('\(name)') + pg_indexes_size('\(name)')") == "24576")
        }
    }

    static func four(_ text: String?) throws -> (String, String, String, String) {
        let parts = (text ?? "").split(separator: " ").map(String.init)
        try #require(parts.count == 4, "\(String(describing: text))")
        return (parts[0], parts[1], parts[2], parts[3])
    }
}
