import Foundation
import MetricsdTestSupport
import Testing

@testable import MetricsdPostgres
@testable import MetricsdWork

/// Every query that looks for a user's newest rows in the history reads the read index
/// `(user_id, computed_at DESC)` forwards, newest entry first; and the row `profile_metrics_latest` keeps for each
/// user is that user's first entry in it.
@Suite struct ReadIndexQueryTests {
    /// Each user's first entry in the read index: the entries at the top of the user's range (newest computed_at),
    /// the greatest id among them when several share it. "user id|row id" per user, users without rows left out.
    static func firstEntry(of user: String) -> String {
        """
        SELECT max(t.id) AS id
        FROM (SELECT p.id FROM profile_metrics p WHERE p.user_id = \(user)
              ORDER BY p.computed_at DESC FETCH FIRST 1 ROW WITH TIES) t
        """
    }
    static let firstEntries = """
        SELECT string_agg(u.id || '|' || f.id, ';' ORDER BY u.id)
        FROM users u CROSS JOIN LATERAL (\(firstEntry(of: "u.id"))) f
        WHERE f.id IS NOT NULL
        """
    static let keptRows =
        "SELECT string_agg(user_id || '|' || metrics_id, ';' ORDER BY user_id) FROM profile_metrics_latest"

    /// The plan reads `profile_metrics` only through the read index's parts, forwards: no scan of the table, no
    /// backward scan, no sort of a user's entries.
    static func expectReadsTheIndexForwards(
        _ plan: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let history = plan.split(separator: "\n").filter {
            $0.contains(" on profile_metrics_") && !$0.contains("profile_metrics_latest")
        }
        #expect(!history.isEmpty, "\(what) reads no history:\n\(plan)", sourceLocation: sourceLocation)
        #expect(
            plan.contains("_user_computed_at_idx on profile_metrics_"), "\(what):\n\(plan)",
            sourceLocation: sourceLocation)
        #expect(!plan.contains("Backward"), "\(what):\n\(plan)", sourceLocation: sourceLocation)
        #expect(!plan.contains("Seq Scan on profile_metrics_"), "\(what):\n\(plan)", sourceLocation: sourceLocation)
    }

    static func plan(_ database: TestDatabase, _ statement: String, parameters: [String?] = [], generic: Bool = false)
        async throws -> String
    {
        try await database.plan(statement, parameters: parameters, generic: generic)
    }

    /// 12,000 users with a row every twelfth day from a month ago to five months ahead, in every monthly partition,
    /// and some in the default partition; settings changed a day ago, five users' ten minutes ago. (With fewer
    /// users PostgreSQL rightly reads the history whole rather than probe it for the hundred users it expects a
    /// time zone change to name: these are the plans of a history of many users.)
    static let seed = """
        SELECT metricsd_add_partitions((current_date + interval '5 months')::date);
        INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 12000) g;
        INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
        SELECT u, 20 + (u * d) % 90 / 10.0, 1400 + (u + d) % 600, 1800 + (u * 13 + d) % 1200, 1,
               current_date - 30 + d * 12, (current_date - 30 + d * 12)::timestamptz + interval '5 minutes' * ((u * d) % 4)
        FROM generate_series(0, 15) d CROSS JOIN generate_series(1, 12000) u
        ORDER BY d, u;
        INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
        SELECT u, 22.0, 1500, 2000, 1, current_date + 400, now() - interval '1 minute' * u
        FROM generate_series(1, 12000, 3) u;
        SET session_replication_role = replica;  -- updated_at as written, not stamped by the settings trigger
        INSERT INTO user_settings (user_id, updated_at)
        SELECT g, now() - CASE WHEN g <= 5 THEN interval '10 minutes' ELSE interval '1 day' END FROM generate_series(1, 12000) g;
        SET session_replication_role = DEFAULT;
        ANALYZE;
        """

    /// The latest table's refresh (`metricsd_history_newest`, as the triggers call it), retention's "is there a
    /// newer row", the settings sweep's "is there a row newer than the change" and a time zone change's removal of
    /// rows dated ahead: each as PostgreSQL plans it for given values and as a prepared statement's generic plan.
    @Test func everyNewestRowQueryReadsTheReadIndexForwards() async throws {
        try await withTestDatabase { database in
            try await database.execute(Self.seed)
            let refresh =
                "SELECT n.id FROM unnest('{7,8,9}'::bigint[]) AS u(id) LEFT JOIN LATERAL metricsd_history_newest(u.id) n ON true"
            Self.expectReadsTheIndexForwards(try await Self.plan(database, refresh), "the refresh")
            Self.expectReadsTheIndexForwards(
                try await Self.plan(database, "SELECT * FROM metricsd_history_newest(42)"), "one user")
            Self.expectReadsTheIndexForwards(
                try await Self.plan(database, Self.firstEntry(of: "7")), "a user's first entry")
            let monthAgo = try #require(try await database.value("SELECT (current_date - 30)::text"))
            let today = try #require(try await database.value("SELECT current_date::text"))
            let retention: [String?] = [nil, "1", "owner", "0", monthAgo, "500", "1", "30"]
            let sweep: [String?] = [
                try await database.value("SELECT (now() - interval '30 minutes')::text"), "1", "5000", "5",
            ]
            let ahead: [String?] = [
                nil, nil, nil, nil, nil, nil, nil, nil, "{7,8}", "{22.5,23.5}", "{1500,1600}", "{2000,2100}",
                "{\(today),\(today)}", "{2026-01-01T00:00:00Z,2026-01-01T00:00:00Z}", "1", "[]", "{}", "settings",
            ]
            for generic in [false, true] {
                let kind = generic ? " (generic plan)" : ""
                let retentionPlan = try await Self.plan(
                    database, SQL.retentionBatch, parameters: retention, generic: generic)
                Self.expectNewerRowCheck(retentionPlan, "retention's newer row\(kind)")
                // The sweep's generic plan is never used: its estimate (a third of all users changed) costs more
                // than the plans for the values given, which PostgreSQL then keeps using.
                if !generic {
                    let sweepPlan = try await Self.plan(database, SQL.staleSettings, parameters: sweep)
                    Self.expectReadsTheIndexForwards(sweepPlan, "the settings sweep")
                }
                let write = SQL.writeBatch(.refreshIfStale, fenced: false)
                let writePlan = try await Self.plan(database, write, parameters: ahead, generic: generic)
                Self.expectReadsTheIndexForwards(Self.section(writePlan, "CTE ahead"), "the rows dated ahead\(kind)")
            }
        }
    }

    /// Retention's statement also reads a date's rows through the exactly-once key; its newer-row checks (the
    /// SubPlans) read the read index forwards.
    static func expectNewerRowCheck(_ plan: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(
            plan.contains("_user_computed_at_idx on profile_metrics_"), "\(what):\n\(plan)",
            sourceLocation: sourceLocation)
        #expect(!plan.contains("Backward"), "\(what):\n\(plan)", sourceLocation: sourceLocation)
    }

    /// The lines of a plan node (`CTE ahead`) and everything below it.
    static func section(_ plan: String, _ node: String) -> String {
        let lines = plan.split(separator: "\n", omittingEmptySubsequences: false)
        guard let start = lines.firstIndex(where: { $0.contains(node) }) else { return "" }
        let indent = lines[start].prefix { $0 == " " }.count
        let rest = lines[(start + 1)...].prefix { $0.prefix { $0 == " " }.count > indent }
        return ([lines[start]] + rest).joined(separator: "\n")
    }

    /// After each of 300 random writes — inserts (ties on `computed_at` too), updates moving `computed_at` either
    /// way, deletes of newest and of old rows, formula version bumps (a row of the next version for many users) —
    /// every user's kept row is their first entry in the read index (read through it: the plan of that lookup is
    /// checked above).
    @Test func eachKeptRowIsTheReadIndexsFirstEntry() async throws {
        try await withTestDatabase { database in
            try await database.execute(HistoryQueries.seed(users: 60))
            var random = SplitMix64(seed: 20_261_129)
            var version = 3
            for step in 0..<300 {
                let user = Int.random(in: 1...60, using: &random)
                let sql: String
                switch Int.random(in: 0..<8, using: &random) {
                case 0, 1:
                    let minutes = Int.random(in: 0..<3, using: &random)
                    sql =
                        "INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) "
                        + "VALUES (\(user), 21.5, 1500, 2000, \(version), current_date + \(step % 90), "
                        + "date_trunc('hour', now()) + interval '1 minute' * \(minutes)) ON CONFLICT DO NOTHING"
                case 2:
                    sql =
                        "UPDATE profile_metrics SET computed_at = computed_at + interval '\(Int.random(in: -90...90, using: &random)) hours' "
                        + "WHERE id = (SELECT id FROM profile_metrics WHERE user_id = \(user) ORDER BY (id * 2654435761) % 101 LIMIT 1)"
                case 3:
                    sql =
                        "DELETE FROM profile_metrics WHERE id = (SELECT metrics_id FROM profile_metrics_latest WHERE user_id = \(user))"
                case 4:
                    sql =
                        "DELETE FROM profile_metrics WHERE id = (SELECT min(id) FROM profile_metrics WHERE user_id = \(user))"
                case 5:
                    version += 1
                    sql =
                        "INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) "
                        + "SELECT id, 23.0, 1600, 2100, \(version), current_date, now() FROM users WHERE id % 3 <> \(step % 3)"
                case 6:
                    sql =
                        "UPDATE profile_metrics SET computed_at = computed_at - interval '1 day' "
                        + "WHERE user_id % 7 = \(user % 7) AND version = \(version)"
                default:
                    sql = "UPDATE profile_metrics SET bmr = bmr + 1 WHERE user_id = \(user)"
                }
                try await database.execute(sql)
                let first = try await database.value(Self.firstEntries)
                #expect(try await database.value(Self.keptRows) == first, "after step \(step): \(sql)")
            }
        }
    }
}
