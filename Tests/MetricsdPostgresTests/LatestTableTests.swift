import Foundation
import Logging
import MetricsdTestSupport
import NIOPosix
import Testing

@testable import MetricsdPostgres

/// `profile_metrics_latest`, the table the latest read probes: whatever is written to `profile_metrics`, and however,
/// it holds each user's newest row (latest `computed_at`, the greater id between equal ones) and nothing else.
/// (That the read probes only this table: `LatestMetricsTests.latestQueryUsesTheIndex`.)
@Suite struct LatestTableTests {
    static func expectInStep(
        _ database: TestDatabase, after step: String, sourceLocation: SourceLocation = #_sourceLocation
    )
        async throws
    {
        let history = try await database.value(HistoryQueries.fromHistory)
        let kept = try await database.value(HistoryQueries.kept)
        #expect(kept == history, "after \(step)", sourceLocation: sourceLocation)
    }

    /// 400 writes of every kind the history sees, drawn at random over 12 users and checked after each: inserts of
    /// one row or several (several for one user in one statement, equal `computed_at`s), upserts that update, updates
    /// that move `computed_at` either way or change only values, deletes of a newest row, of an old one, of all of a
    /// user's rows, writes with triggers switched off for the session (`session_replication_role = replica`, as
    /// bulk loads do), a user's deletion, and TRUNCATEs (of the history alone, and of the users with the history).
    @Test func everyKindOfWriteKeepsEachUsersNewestRow() async throws {
        try await withTestDatabase { database in
            try await database.execute("INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 12) g")
            var random = SplitMix64(seed: 20_261_127)  // seeded: a failing sequence replays
            var nextDay = 0
            func row(_ user: Int, _ random: inout SplitMix64) -> String {
                nextDay += 1
                let minute = Int.random(in: 0..<4, using: &random)  // equal computed_at now and then
                let version = Int.random(in: 1...3, using: &random)
                return
                    "(\(user), \(Int.random(in: 150...350, using: &random)) / 10.0, \(Int.random(in: 1200...2200, using: &random)), "
                    + "\(Int.random(in: 1500...3200, using: &random)), \(version), date '2026-01-01' + \(nextDay), "
                    + "timestamptz '2026-03-01T00:00:00Z' + interval '1 minute' * \(minute * 1000 + Int.random(in: 0...900, using: &random)))"
            }
            let insert =
                "INSERT INTO profile_metrics AS pm (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) VALUES "
            var (mostKept, fewestKept) = (0, Int.max)
            for step in 0..<400 {
                let user = Int.random(in: 1...12, using: &random)
                // Now and then, at fixed steps: a user's deletion and the two truncations.
                let kind =
                    step % 100 == 99
                    ? 97 : step % 100 == 49 ? 98 : step % 25 == 13 ? 99 : Int.random(in: 0..<14, using: &random)
                let sql: String
                switch kind {
                case 0, 1, 2:
                    sql = insert + row(user, &random)
                case 3:
                    sql =
                        insert
                        + (0..<4).map { _ in row(Int.random(in: 1...12, using: &random), &random) }.joined(
                            separator: ", ")
                case 4:
                    sql = insert + row(user, &random) + ", " + row(user, &random) + ", " + row(user, &random)
                case 5:
                    // An upsert on an existing row (the daily unit's repeated chunk): values and computed_at move.
                    sql = """
                        INSERT INTO profile_metrics AS pm (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                        SELECT user_id, bmi + 0.1, bmr + 1, tdee + 1, version, metrics_date, computed_at + interval '90 minutes'
                        FROM profile_metrics WHERE user_id = \(user) ORDER BY id LIMIT 1
                        ON CONFLICT (metrics_date, version, user_id) DO UPDATE
                          SET bmi = excluded.bmi, bmr = excluded.bmr, tdee = excluded.tdee,
                              computed_at = greatest(excluded.computed_at, pm.computed_at + interval '1 millisecond')
                        """
                case 6:
                    sql =
                        "UPDATE profile_metrics SET computed_at = computed_at + interval '7 days' WHERE id = "
                        + "(SELECT id FROM profile_metrics WHERE user_id = \(user) ORDER BY random() LIMIT 1)"
                case 7:
                    // Backwards: the newest row may stop being the newest.
                    sql =
                        "UPDATE profile_metrics SET computed_at = computed_at - interval '30 days' WHERE id = "
                        + "(SELECT id FROM profile_metrics WHERE user_id = \(user) ORDER BY computed_at DESC, id DESC LIMIT 1)"
                case 8:
                    sql = "UPDATE profile_metrics SET bmr = bmr + 7 WHERE user_id = \(user)"
                case 9:
                    sql =
                        "DELETE FROM profile_metrics WHERE id = "
                        + "(SELECT id FROM profile_metrics WHERE user_id = \(user) ORDER BY computed_at DESC, id DESC LIMIT 1)"
                case 10:
                    sql =
                        "DELETE FROM profile_metrics WHERE id = "
                        + "(SELECT id FROM profile_metrics WHERE user_id = \(user) ORDER BY computed_at, id LIMIT 1)"
                case 11:
                    sql =
                        Int.random(in: 0..<3, using: &random) == 0
                        ? "DELETE FROM profile_metrics WHERE user_id = \(user)"
                        : "DELETE FROM profile_metrics WHERE user_id IN (\(user), \(user % 12 + 1)) AND version = 2"
                case 12:
                    sql =
                        "SET session_replication_role = replica; " + insert + row(user, &random)
                        + "; DELETE FROM profile_metrics WHERE id = (SELECT min(id) FROM profile_metrics WHERE user_id = \(user % 12 + 1))"
                        + "; SET session_replication_role = DEFAULT"
                case 97:
                    sql = "TRUNCATE profile_metrics"
                case 98:
                    // The truncation cascades to the kept table too, in the same statement as its trigger.
                    sql =
                        "TRUNCATE users, profile_metrics CASCADE; "
                        + "INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 12) g"
                case 99:
                    sql =
                        "DELETE FROM users WHERE id = \(user); INSERT INTO users (id, timezone) VALUES (\(user), 'UTC')"
                default:
                    sql = insert + row(user, &random)
                }
                // One statement at a time, as separate transactions: a failed one (a duplicate key) changes nothing.
                do {
                    try await database.execute(sql)
                } catch let error as PostgresError where error.sqlState == "23505" {
                    continue
                }
                try await Self.expectInStep(database, after: "step \(step): \(sql)")
                let kept = Int(try await database.value("SELECT count(*) FROM profile_metrics_latest") ?? "") ?? 0
                (mostKept, fewestKept) = (max(mostKept, kept), step > 10 ? min(fewestKept, kept) : fewestKept)
            }
            // The sequence went through the states that matter: most users with rows, and all of them without.
            #expect(mostKept >= 10 && fewestKept == 0, "kept rows ranged over \(fewestKept)...\(mostKept)")
        }
    }

    /// A newer row committed while a time zone change removes the kept one: the removal's trigger, which looked for
    /// the user's newest row before that commit, waits for it and leaves the newer row kept.
    @Test func aNewerRowCommittedMeanwhileStaysKept() async throws {
        try await withTestDatabase { database in
            try await database.execute(
                """
                INSERT INTO users (id, timezone) VALUES (1, 'UTC');
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) VALUES
                  (1, 22.0, 1600, 2000, 1, '2026-03-01', '2026-03-01T00:05:00Z'),
                  (1, 22.1, 1601, 2001, 1, '2026-03-02', '2026-03-02T00:05:00Z');
                """)
            let settings = try ConnectionSettings(conninfo: database.url, environment: [:])
            let writer = try PostgresConnection(settings: settings)
            // The writer's newer row is upserted into the kept table and holds its lock until COMMIT.
            try writer.execute(
                """
                BEGIN;
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                VALUES (1, 30.0, 1900, 2400, 2, '2026-03-02', '2026-03-02T12:00:00Z');
                """)
            let removal = Task {
                try await TestDatabase.blocking.runIfActive {
                    try PostgresConnection(settings: settings).execute(
                        "DELETE FROM profile_metrics WHERE metrics_date = '2026-03-02' AND version = 1")
                }
            }
            // The removal looks for the newest row (it cannot see the uncommitted one) and then waits for the lock.
            var waiting = false
            for _ in 0..<100 where !waiting {
                waiting =
                    try await database.value(
                        """
                        SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM profile_metrics%'
                        """)
                    == "1"
                if !waiting { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(waiting)
            try writer.execute("COMMIT")
            try await removal.value
            #expect(try await database.value("SELECT bmi FROM profile_metrics_latest WHERE user_id = 1") == "30.0")
            try await Self.expectInStep(database, after: "the concurrent write and removal")
        }
    }

    /// The migration that adds the table copies each user's newest row of an existing history (ties on
    /// `computed_at` to the greater id); users without metrics get none.
    @Test func theMigrationKeepsTheNewestRowOfAnExistingHistory() async throws {
        let (name, url) = try await MigrationTests.freshDatabase()
        defer { Task { await MigrationTests.drop(name) } }
        let earlier = Migration.all.filter { $0.name < "0012" }
        #expect(earlier.last?.name.hasPrefix("0011_") == true)
        _ = try await MigrationTests.migrate(url, migrator: Migrator(migrations: earlier))
        let settings = try ConnectionSettings(conninfo: url, environment: [:])
        let value: @Sendable (String) throws -> String? = { sql in
            let result = try PostgresConnection(settings: settings).query(sql)
            return result.rowCount == 0 ? nil : result.string(0, 0)
        }
        _ = try await TestDatabase.blocking.runIfActive {
            try PostgresConnection(settings: settings).execute(
                """
                INSERT INTO users (id, timezone) SELECT g, 'UTC' FROM generate_series(1, 300) g;
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u, 20 + (d % 7), 1500 + d, 1900 + u, 1 + (d % 2), date '2025-01-01' + d,
                       timestamptz '2025-01-01T00:05:00Z' + interval '1 day' * d - interval '1 hour' * (u % 3) * (d % 5)
                FROM generate_series(1, 250) u CROSS JOIN generate_series(0, 40) d;
                -- a tie: a second row at the newest instant of user 7
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT 7, 31.0, 1999, 2999, 3, metrics_date, computed_at FROM profile_metrics
                WHERE user_id = 7 ORDER BY computed_at DESC LIMIT 1;
                """)
        }
        #expect(try await MigrationTests.migrate(url) == Migration.all.filter { $0.name >= "0012" }.map(\.name))
        let (history, kept, count, tie) = try await TestDatabase.blocking.runIfActive {
            (
                try value(HistoryQueries.fromHistory), try value(HistoryQueries.kept),
                try value("SELECT count(*) FROM profile_metrics_latest"),
                try value("SELECT bmi FROM profile_metrics_latest WHERE user_id = 7")
            )
        }
        #expect(count == "250")
        #expect(kept == history)
        #expect(tie == "31.0")
    }

    /// An instance of the previous release writing while the migration runs: the migration waits for its
    /// transaction, and the row it wrote is kept, although no trigger existed when it was inserted.
    @Test func aWriteInFlightDuringTheMigrationIsKept() async throws {
        let (name, url) = try await MigrationTests.freshDatabase()
        defer { Task { await MigrationTests.drop(name) } }
        _ = try await MigrationTests.migrate(
            url, migrator: Migrator(migrations: Migration.all.filter { $0.name < "0012" }))
        let settings = try ConnectionSettings(conninfo: url, environment: [:])
        let writer = try PostgresConnection(settings: settings)
        try writer.execute(
            """
            INSERT INTO users (id, timezone) VALUES (1, 'UTC'), (2, 'UTC');
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) VALUES
              (1, 22.0, 1600, 2000, 1, '2026-03-01', '2026-03-01T00:05:00Z');
            BEGIN;
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at) VALUES
              (1, 23.0, 1610, 2010, 1, '2026-03-02', '2026-03-02T00:05:00Z'),
              (2, 24.0, 1620, 2020, 1, '2026-03-02', '2026-03-02T00:05:00Z');
            """)
        let migration = Task { try await MigrationTests.migrate(url) }
        let admin = FaultDatabase(url: url)
        var waiting = false
        for _ in 0..<100 where !waiting {
            waiting =
                try await admin.value(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                .flatMap(Int.init) ?? 0 > 0
            if !waiting { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(waiting, "the migration did not wait for the writer")
        try writer.execute("COMMIT")
        #expect(try await migration.value == Migration.all.filter { $0.name >= "0012" }.map(\.name))
        let kept = try await TestDatabase.blocking.runIfActive {
            try PostgresConnection(settings: settings).query(
                "SELECT string_agg(user_id || ':' || bmi, ',' ORDER BY user_id) FROM profile_metrics_latest"
            ).string(0, 0)
        }
        #expect(kept == "1:23.0,2:24.0")
    }
}
