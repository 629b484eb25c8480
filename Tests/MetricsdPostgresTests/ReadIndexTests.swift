import Foundation
import Logging
import MetricsdTestSupport
import NIOPosix
import Testing

@testable import MetricsdPostgres

/// The read index `profile_metrics_user_computed_at_idx ON profile_metrics (user_id, computed_at DESC)`: made
/// descending on every partition by a migration that runs outside a transaction and can stop anywhere, read
/// forwards by every query that looks for a user's newest rows, and its first entry for each user is the row
/// `profile_metrics_latest` keeps.
@Suite struct ReadIndexTests {
    static let migration = "0021_read_index_descending.sql"

    /// A database migrated up to the read index's migration, with 400 users' rows over several monthly partitions
    /// and the default partition.
    static func databaseBeforeTheMigration() async throws -> (name: String, url: String) {
        let (name, url) = try await MigrationTests.freshDatabase()
        _ = try await MigrationTests.migrate(
            url, migrator: Migrator(migrations: Migration.all.filter { $0.name < "0021" }))
        try await FaultDatabase(url: url).execute(
            HistoryQueries.seed(users: 400)
                + """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u, 22.0, 1500, 2000, 1, current_date + 400, now() - interval '1 minute' * u
                FROM generate_series(1, 400, 3) u;
                ANALYZE profile_metrics;
                """)
        return (name, url)
    }

    /// What is wrong with the read index, empty when it is right: the partitioned index descending and valid, and
    /// every partition's part descending, valid, attached and named after its partition; no ascending one left,
    /// and no partition with an index more than its key on id, the exactly-once key and the read index.
    static let problems = """
        SELECT concat_ws('; ',
          CASE WHEN pg_get_indexdef('profile_metrics_user_computed_at_idx'::regclass)
                    <> 'CREATE INDEX profile_metrics_user_computed_at_idx ON ONLY public.profile_metrics USING btree (user_id, computed_at DESC)'
               THEN 'parent: ' || pg_get_indexdef('profile_metrics_user_computed_at_idx'::regclass) END,
          CASE WHEN NOT (SELECT indisvalid FROM pg_index WHERE indexrelid = 'profile_metrics_user_computed_at_idx'::regclass)
               THEN 'parent invalid' END,
          (SELECT 'without a right part: ' || string_agg(c.relname, ',') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'profile_metrics'::regclass
             AND NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_inherits a ON a.inhrelid = x.indexrelid
                             WHERE x.indrelid = c.oid AND a.inhparent = 'profile_metrics_user_computed_at_idx'::regclass
                               AND x.indisvalid AND x.indexrelid::regclass::text = c.relname || '_user_computed_at_idx'
                               AND pg_get_indexdef(x.indexrelid) LIKE '%USING btree (user_id, computed_at DESC)')),
          (SELECT 'ascending: ' || string_agg(x.indexrelid::regclass::text, ',') FROM pg_index x
           WHERE pg_get_indexdef(x.indexrelid) LIKE '%profile_metrics%USING btree (user_id, computed_at)'),
          (SELECT 'extra indexes on: ' || string_agg(c.relname, ',') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'profile_metrics'::regclass AND (SELECT count(*) FROM pg_index x WHERE x.indrelid = c.oid) <> 3))
        """

    static func expectDescendingEverywhere(
        _ url: String, _ context: String, sourceLocation: SourceLocation = #_sourceLocation
    )
        async throws
    {
        let database = FaultDatabase(url: url)
        #expect(try await database.value(Self.problems) == "", "\(context)", sourceLocation: sourceLocation)
        let kept = try await database.value(HistoryQueries.kept)
        #expect(
            try await database.value(HistoryQueries.fromHistory) == kept, "\(context)", sourceLocation: sourceLocation)
    }

    /// The migration on an existing history: every partition's part built and attached, the ascending index gone,
    /// the names as before, the rows and the kept rows unchanged; a month made afterwards gets the descending index;
    /// a second run does nothing.
    @Test func theMigrationMakesTheReadIndexDescendingOnEveryPartition() async throws {
        let (name, url) = try await Self.databaseBeforeTheMigration()
        defer { Task { await MigrationTests.drop(name) } }
        let database = FaultDatabase(url: url)
        let before = try await database.value("SELECT count(*) || ':' || sum(id) FROM profile_metrics")
        let partitions = try await database.int(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'profile_metrics'::regclass")
        #expect(partitions >= 6, "the until partition, the default one and monthly ones")
        #expect(try await MigrationTests.migrate(url) == Migration.all.filter { $0.name >= "0021" }.map(\.name))
        try await Self.expectDescendingEverywhere(url, "after the migration")
        #expect(try await database.value("SELECT count(*) || ':' || sum(id) FROM profile_metrics") == before)
        #expect(
            try await database.int("SELECT metricsd_add_partitions((current_date + interval '9 months')::date)") >= 1)
        try await Self.expectDescendingEverywhere(url, "after months were added")
        #expect(try await MigrationTests.migrate(url) == [])
    }

    /// Stopped after any of its statements (the connection gone, nothing recorded), the next run finishes it.
    @Test(arguments: 1...6) func aRunStoppedAfterAnyStatementIsFinishedByTheNext(statements: Int) async throws {
        let (name, url) = try await Self.databaseBeforeTheMigration()
        defer { Task { await MigrationTests.drop(name) } }
        try await Self.runFirst(statements, url: url)
        #expect(try await MigrationTests.migrate(url) == [Self.migration])
        try await Self.expectDescendingEverywhere(url, "stopped after \(statements) statements")
    }

    /// A part whose build was cancelled (an invalid index, as a crash during CREATE INDEX CONCURRENTLY leaves it) is
    /// dropped and built again by the next run.
    @Test func anInvalidPartLeftByACancelledBuildIsBuiltAgain() async throws {
        let (name, url) = try await Self.databaseBeforeTheMigration()
        defer { Task { await MigrationTests.drop(name) } }
        try await Self.runFirst(3, url: url)
        let database = FaultDatabase(url: url)
        let partition = try #require(
            try await database.value(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    + "WHERE i.inhparent = 'profile_metrics'::regclass ORDER BY c.relname LIMIT 1"))
        // A writer's open transaction makes the build wait; it is cancelled while it waits.
        let settings = try ConnectionSettings(conninfo: url, environment: [:])
        let writer = try PostgresConnection(settings: settings)
        try writer.execute("BEGIN; UPDATE \(partition) SET bmr = bmr WHERE id = (SELECT min(id) FROM \(partition));")
        let build = Task {
            try await TestDatabase.blocking.runIfActive {
                try PostgresConnection(settings: settings).execute(
                    "CREATE INDEX CONCURRENTLY \(partition)_user_computed_at_desc_idx ON \(partition) (user_id, computed_at DESC)"
                )
            }
        }
        let waiting = await DaemonProcess.eventually(timeout: .seconds(20)) {
            (try? await database.int(
                """
                SELECT pg_cancel_backend(pid)::int FROM pg_stat_activity
                WHERE query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'
                """))
                == 1
        }
        #expect(waiting)
        await #expect(throws: PostgresError.self) { try await build.value }
        try writer.execute("COMMIT")
        #expect(
            try await database.value(
                "SELECT indisvalid::text FROM pg_index WHERE indexrelid = '\(partition)_user_computed_at_desc_idx'::regclass"
            ) == "false")
        #expect(try await MigrationTests.migrate(url) == [Self.migration])
        try await Self.expectDescendingEverywhere(url, "after the invalid part")
    }

    /// Runs the first `count` statements of the migration (a `\gexec` query with all it generates) on a connection
    /// that then closes, and forgets that it ran: what a crash after them leaves.
    static func runFirst(_ count: Int, url: String) async throws {
        let full = try #require(Migration.all.first { $0.name == Self.migration })
        let steps = MigrationScript.steps(of: full.sql).prefix(count)
        #expect(steps.count == count)
        let text = steps.map { $0.sql + ($0.generatesStatements ? "\n\\gexec\n" : ";\n") }.joined()
        let partial = Migration(name: Self.migration, sql: text)
        #expect(partial.runsOutsideTransaction)
        _ = try await MigrationTests.migrate(url, migrator: Migrator(migrations: [partial]))
        try await FaultDatabase(url: url).execute("DELETE FROM metricsd_migrations WHERE name = '\(Self.migration)'")
    }
}
