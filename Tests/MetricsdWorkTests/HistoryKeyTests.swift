import Foundation
import HealthMetrics
import Logging
import MetricsdTestSupport
import Testing

@testable import MetricsdPostgres
@testable import MetricsdWork

/// The exactly-once key as the history grows: `profile_metrics_date_version_user_key`, on
/// `(metrics_date, version, user_id)`, is the only unique index on those columns, every write that names them still
/// finds its row with one probe, and a retention batch reads one date through it per formula version.
@Suite struct HistoryKeyTests {
    /// 5,000 users × 21 days of version 1, and version 2 rows beside them on the last 5 days: a date holding two
    /// formula versions, as after a bump.
    static func seed(_ database: TestDatabase) async throws {
        try await database.execute(
            """
            INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 5000) g;
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
            SELECT u, 22.5, 1600, 2000, v, d::date, d + interval '5 minutes' + (v * 3600 + u % 600) * interval '1 second'
            FROM generate_series('2026-01-01'::timestamptz, '2026-01-21', '1 day') d
            CROSS JOIN generate_series(1, 2) v CROSS JOIN generate_series(1, 5000) u
            WHERE v = 1 OR d >= '2026-01-17'
            ORDER BY d, v, u;
            ANALYZE users; ANALYZE profile_metrics;
            """)
    }

    static func plan(_ database: TestDatabase, prepare: String, execute: String) async throws -> String {
        try await database.pool.withConnection { connection in
            try connection.execute("SET plan_cache_mode = force_generic_plan")
            try connection.execute(prepare)
            let result = try connection.query("EXPLAIN " + execute)
            return (0..<result.rowCount).compactMap { result.string($0, 0) }.joined(separator: "\n")
        }
    }

    @Test func theKeyIsLedByTheDateThenTheVersion() async throws {
        try await withTestDatabase { database in
            let unique = try await database.rows(
                """
                SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index
                WHERE indrelid = 'profile_metrics'::regclass AND indisunique AND NOT indisprimary
                """)
            #expect(unique.count == 1, "\(unique)")
            #expect(unique.first?[0] == "profile_metrics_date_version_user_key")
            #expect(unique.first?[1]?.hasSuffix("(metrics_date, version, user_id)") == true, "\(unique)")
            let options = try await database.value(
                "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = 'profile_metrics_pkey'")
            #expect(options == "fillfactor=100")
            // Still the exactly-once key: a second row for the same user, date and version is refused, whatever
            // its computed_at; another version of the same date is not.
            try await database.seed([SeedUser.valid(1)])
            try await database.execute(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                VALUES (1, 20.0, 1500, 1800, 1, '2026-01-01', '2026-01-01T00:05:00Z'),
                       (1, 20.0, 1500, 1800, 2, '2026-01-01', '2026-01-01T09:00:00Z')
                """)
            var refused = false
            do {
                try await database.execute(
                    """
                    INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                    VALUES (1, 21.0, 1510, 1810, 1, '2026-01-01', '2026-01-01T12:00:00Z')
                    """)
            } catch {
                // (named by the partition's part of the key: profile_metrics_<partition>_date_version_user_key)
                refused = "\(error)".contains("_date_version_user_key")
            }
            #expect(refused, "the duplicate was not refused by the key")
        }
    }

    /// A retention batch finds the versions of its date and each version's next users through the key (index
    /// conditions on the date, the version and the user range), and removes through it too: never a scan of the
    /// table or of the whole date.
    @Test func aRetentionBatchReadsItsDatePerVersionThroughTheKey() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            let plan = try await Self.plan(
                database,
                prepare: "PREPARE retention_batch(timestamptz, bigint, text, bigint, date, int, bigint, float8) AS "
                    + SQL.retentionBatch,
                execute: "EXECUTE retention_batch('2026-03-02T12:00:00Z', 1, 'w1', 1200, '2026-01-18', 1000, 1, 60)")
            // (The seeded rows are in one partition; the planner reads the empty ones whole, which costs nothing.)
            #expect(!plan.contains("Seq Scan on profile_metrics_until_"), "plan:\n\(plan)")
            let keyed = plan.components(separatedBy: "\n").filter { $0.contains("_date_version_user_key") }
            #expect(keyed.count >= 3, "plan:\n\(plan)")
            #expect(plan.contains("(version = ANY ("), "the removal's versions are an index condition; plan:\n\(plan)")
            #expect(plan.contains("(user_id > $4)"), "each version's users are a range of the key; plan:\n\(plan)")
            // The newer row of each removed one is found through the read index.
            #expect(plan.contains("_user_computed_at_idx"), "plan:\n\(plan)")
        }
    }
}
