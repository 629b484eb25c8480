import Foundation
import MetricsdTestSupport
import NIOPosix
import Testing

@testable import MetricsdPostgres

/// `profile_metrics_latest` under statements that touch many users at once — an operator's clean-up, a batch
/// erasure, the cascade from deleting users: it still holds each user's newest row afterwards, and the triggers lock
/// the kept rows in ascending user id, the order in which every writer of the table locks them.
@Suite struct LatestTableBulkTests {
    /// 400 users with rows over several monthly partitions, then 60 statements drawn at random, each touching many
    /// users, checked after each: deletes of every chosen user's newest row, of all their rows, of a formula
    /// version, of scattered rows; updates moving `computed_at` back or forward, changing values only, moving rows
    /// to another user; inserts of many rows (several for one user, equal `computed_at`s, a new formula version);
    /// the daily unit's upsert over existing rows; deletes of users (the cascade) and their return.
    @Test func bulkStatementsOfRandomShapesKeepEachUsersNewestRow() async throws {
        try await withTestDatabase { database in
            try await database.execute(HistoryQueries.seed(users: 400))
            var random = SplitMix64(seed: 20_261_128)  // seeded: a failing sequence replays
            var (emptied, replaced) = (0, 0)
            for step in 0..<60 {
                let sql = Self.statement(step, &random)
                let before = try await database.value(HistoryQueries.kept)
                do {
                    try await database.execute(sql)
                } catch let error as PostgresError where error.sqlState == "23505" {
                    continue  // moving rows to another user can hit the exactly-once key: nothing changed
                }
                try await LatestTableTests.expectInStep(database, after: "step \(step): \(sql)")
                let users = Int(try await database.value("SELECT count(*) FROM profile_metrics_latest") ?? "") ?? 0
                if users < 400 { emptied += 1 }
                if try await database.value(HistoryQueries.kept) != before { replaced += 1 }
            }
            // The statements changed kept rows, and left users without any row at times.
            #expect(replaced >= 30 && emptied >= 5, "replaced \(replaced), emptied \(emptied)")
        }
    }

    /// A bulk statement's trigger locks the kept rows one user after the other, ascending: while it waits for the
    /// lock another session holds on user 150's kept row, it holds every kept row below 150 and none above.
    @Test func aBulkStatementLocksKeptRowsInAscendingUserOrder() async throws {
        try await withTestDatabase { database in
            try await database.execute(HistoryQueries.seed(users: 300))
            let settings = try ConnectionSettings(conninfo: database.url, environment: [:])
            let holder = try PostgresConnection(settings: settings)
            try holder.execute("BEGIN; SELECT 1 FROM profile_metrics_latest WHERE user_id = 150 FOR UPDATE;")
            let removal = Task {
                try await TestDatabase.blocking.runIfActive {
                    try PostgresConnection(settings: settings).execute(Self.deleteNewest(where: "true"))
                }
            }
            let waiting = await DaemonProcess.eventually(timeout: .seconds(20)) {
                (try? await database.value(
                    """
                    SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM profile_metrics p USING%'
                    """)) == "1"
            }
            #expect(waiting, "the bulk delete did not wait for user 150's kept row")
            // Which kept rows are free now (FOR SHARE SKIP LOCKED skips those the delete holds).
            let free = try await database.pool.withConnection { connection in
                try connection.transaction { connection in
                    let result = try connection.query(
                        """
                        SELECT count(*) FILTER (WHERE user_id < 150), count(*) FILTER (WHERE user_id > 150)
                        FROM (SELECT user_id FROM profile_metrics_latest FOR SHARE SKIP LOCKED) s
                        """)
                    return [result.string(0, 0), result.string(0, 1)]
                }
            }
            #expect(free == ["0", "150"], "kept rows not held by the delete, below and above 150")
            try holder.execute("COMMIT")
            try await removal.value
            try await LatestTableTests.expectInStep(database, after: "the bulk delete")
        }
    }

    /// Deletes the newest row of every user the condition (on `l`, the kept row) picks.
    static func deleteNewest(where condition: String) -> String {
        "DELETE FROM profile_metrics p USING profile_metrics_latest l "
            + "WHERE p.id = l.metrics_id AND p.metrics_date = l.metrics_date AND \(condition)"
    }

    /// The `step`th statement: a shape drawn at random, over a share of the users drawn at random.
    static func statement(_ step: Int, _ random: inout SplitMix64) -> String {
        let modulus = Int.random(in: 1...5, using: &random)
        let rest = Int.random(in: 0..<modulus, using: &random)
        let users = "user_id % \(modulus) = \(rest)"
        let chosen = "u.id % \(modulus) = \(rest)"
        let days = Int.random(in: 1...60, using: &random)
        switch Int.random(in: 0..<12, using: &random) {
        case 0, 1:
            return Self.deleteNewest(where: "l.\(users)")
        case 2:
            return "DELETE FROM profile_metrics WHERE \(users) AND version = \(Int.random(in: 1...4, using: &random))"
        case 3:
            return "DELETE FROM profile_metrics WHERE (id * 2654435761) % 7 = \(Int.random(in: 0..<7, using: &random))"
        case 4:
            return "UPDATE profile_metrics SET computed_at = computed_at - interval '\(days) days' "
                + "WHERE id IN (SELECT metrics_id FROM profile_metrics_latest WHERE \(users))"
        case 5:
            return "UPDATE profile_metrics SET computed_at = computed_at + interval '\(days) days' "
                + "WHERE \(users) AND (id * 2654435761) % 5 = 0"
        case 6:
            return "UPDATE profile_metrics SET bmr = bmr + 1, tdee = tdee - 1 WHERE \(users)"
        case 7:
            return
                "UPDATE profile_metrics SET user_id = user_id % 400 + 1 WHERE \(users) AND version = 3 AND metrics_date > current_date"
        case 8:
            // A version bump (recompute-all): a row of a new version for every chosen user, some twice, equal instants.
            return """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u.id, 24.0, 1700, 2300, 4 + k, current_date + \(step % 20), now() - interval '\(days) hours'
                FROM users u CROSS JOIN generate_series(0, u.id % 2) k WHERE \(chosen)
                ON CONFLICT DO NOTHING
                """
        case 9:
            // The daily unit's upsert over rows that exist: values and computed_at move forward.
            return """
                INSERT INTO profile_metrics AS pm (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT user_id, bmi + 0.1, bmr + 1, tdee + 1, version, metrics_date, computed_at + interval '\(days) hours'
                FROM profile_metrics WHERE \(users) AND metrics_date = (SELECT max(metrics_date) FROM profile_metrics)
                ORDER BY user_id
                ON CONFLICT (metrics_date, version, user_id) DO UPDATE
                  SET bmi = excluded.bmi, bmr = excluded.bmr, tdee = excluded.tdee,
                      computed_at = greatest(excluded.computed_at, pm.computed_at + interval '1 millisecond')
                """
        case 10:
            return "DELETE FROM users WHERE id % \(modulus + 3) = \(rest); "
                + "INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 400) g ON CONFLICT DO NOTHING"
        default:
            return """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u.id, 25.5, 1650, 2250, 1 + u.id % 3, current_date + 30 + \(step), now() + interval '\(days) minutes'
                FROM users u WHERE \(chosen)
                ON CONFLICT DO NOTHING
                """
        }
    }
}
