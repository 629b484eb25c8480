import Foundation
import HealthMetrics
import Logging
import MetricsdTestSupport
import NIOCore
import NIOPosix
import Testing

@testable import MetricsdPostgres

/// The libpq adapter, the pool and the migrator against the real server.
@Suite struct PostgresTests {
    @Test func syntaxErrorCarriesSQLStateAndMessage() async throws {
        try await withTestDatabase { database in
            let error = await #expect(throws: PostgresError.self) {
                try await database.pool.withConnection { try $0.query("SELEC 1") }
            }
            #expect(error?.sqlState == "42601")
            #expect(error?.code == .queryFailed)
            #expect(error?.errorCode == "database.query_failed")
            #expect(error?.message.contains("syntax error") == true)
        }
    }

    @Test func parametersAreNeverSQL() async throws {
        try await withTestDatabase { database in
            let hostile = "1'); DROP TABLE users; --"
            let value = try await database.pool.withConnection {
                try $0.query("SELECT $1::text", [hostile]).string(0, 0)
            }
            #expect(value == hostile)
            #expect(try await database.value("SELECT to_regclass('users') IS NOT NULL") == "t")
            let error = await #expect(throws: PostgresError.self) {
                try await database.pool.withConnection { try $0.query("SELECT $1::bigint", [hostile]) }
            }
            #expect(error?.sqlState == "22P02")
        }
    }

    /// A LISTEN connection's wait for notifications ends when a notification arrives, and at once when another
    /// thread interrupts it (a stop), long before its timeout; once interrupted, every later wait returns at once.
    @Test func aNotificationWaitEndsOnANotificationOrAnInterrupt() async throws {
        try await withTestDatabase { database in
            let connection = try await database.pool.openDedicatedConnection()
            try await database.pool.runBlocking { try connection.execute("LISTEN metricsd_test_wait") }
            let interrupter = try WaitInterrupter()
            let clock = ContinuousClock()

            async let waited = database.pool.runBlocking {
                try connection.waitForNotifications(timeoutMilliseconds: 60_000, interrupter: interrupter)
            }
            try await Task.sleep(for: .milliseconds(200))
            try await database.pool.withConnection { try $0.execute("NOTIFY metricsd_test_wait, '7'") }
            let notified = try await waited
            #expect(notified.map(\.payload) == ["7"])

            let started = clock.now
            async let interrupted = database.pool.runBlocking {
                try connection.waitForNotifications(timeoutMilliseconds: 60_000, interrupter: interrupter)
            }
            try await Task.sleep(for: .milliseconds(200))
            interrupter.interrupt()
            #expect(try await interrupted.isEmpty)
            #expect(clock.now - started < .seconds(5), "the interrupted wait took \(clock.now - started)")

            let again = clock.now
            _ = try await database.pool.runBlocking {
                try connection.waitForNotifications(timeoutMilliseconds: 60_000, interrupter: interrupter)
            }
            #expect(clock.now - again < .seconds(2), "a wait after the interrupt took \(clock.now - again)")
        }
    }

    @Test func malformedConnectionStringIsRefusedUpFront() {
        #expect(throws: PostgresError.self) { try ConnectionSettings(conninfo: "host='unterminated", environment: [:]) }
        #expect(throws: PostgresError.self) {
            try ConnectionSettings(conninfo: "host=db sslmode=sometimes", environment: [:])
        }
        #expect(throws: PostgresError.self) {
            try ConnectionSettings(conninfo: "postgresql://x:notaport/db", environment: [:])
        }
        #expect(throws: PostgresError.self) { try ConnectionSettings(conninfo: "bogus_option=1", environment: [:]) }
        #expect((try? ConnectionSettings(conninfo: "", environment: [:])) != nil)
        #expect((try? ConnectionSettings(conninfo: "host=/tmp dbname=x sslmode=disable", environment: [:])) != nil)
    }

    @Test func operatorSettingsWinOverMetricsdDefaults() throws {
        let settings = try ConnectionSettings(
            conninfo: "postgresql://h/db?connect_timeout=9", environment: ["PGAPPNAME": "x"])
        #expect(settings.conninfo == "postgresql://h/db?connect_timeout=9")
    }

    /// Nothing in the startup packet that a pooler refuses: metricsd adds no `options` (the operator's own, in the
    /// string, still reach the server), and a direct session is not taken for a pooled one.
    @Test func theStartupPacketHoldsNoOptionsOfMetricsds() async throws {
        try await withTestDatabase { database in
            let jit: @Sendable (ConnectionSettings) throws -> (String?, Bool, Bool) = { settings in
                let connection = try PostgresConnection(settings: settings)
                return (
                    try connection.query("SHOW jit").string(0, 0), connection.isPooled, connection.usesNamedStatements
                )
            }
            let plain = try ConnectionSettings(conninfo: database.url, environment: [:])
            #expect(!plain.parameters.contains { $0.0 == "options" })
            #expect(!plain.setsStartupOptions(environment: [:]))
            let direct = try await TestDatabase.blocking.runIfActive { try jit(plain) }
            #expect(direct.1 == false && direct.2 == true)
            let separator = database.url.contains("?") ? "&" : "?"
            let own = try ConnectionSettings(
                conninfo: database.url + separator + "options=-c%20jit%3Doff", environment: [:])
            #expect(own.setsStartupOptions(environment: [:]))
            #expect(try await TestDatabase.blocking.runIfActive { try jit(own) }.0 == "off")
            let unnamed = {
                var settings = plain
                settings.statementMode = .unnamed
                return settings
            }()
            #expect(try await TestDatabase.blocking.runIfActive { try jit(unnamed) }.2 == false)
        }
    }

    /// What `/readyz` says about a database problem names no host, port or socket path.
    @Test(arguments: [
        ("connection to server at \"10.1.2.3\", port 5432 failed: Connection refused", "connection refused"),
        (
            "connection to server on socket \"/var/run/postgresql/.s.PGSQL.5432\" failed: No such file or directory",
            "no server at the socket"
        ),
        (
            "connection to server at \"db.internal\" (10.0.0.7), port 5432 failed: FATAL:  sorry, too many clients already",
            "too many connections"
        ),
        (
            "connection to server at \"db\", port 5432 failed: FATAL:  password authentication failed for user \"metricsd\"",
            "authentication failed"
        ),
        ("could not translate host name \"db.internal\" to address: Name or service not known", "host name not found"),
        ("something else entirely at /etc/secret/path", "connection failed"),
    ])
    func summaryNamesNoHostPortOrPath(message: String, summary: String) {
        let error = PostgresError(code: .connectionFailed, message: message)
        #expect(error.summary == summary)
        for secret in ["10.1.2.3", "5432", "/var/run", "db.internal", "metricsd", "/etc"] {
            #expect(!error.summary.contains(secret))
        }
    }

    @Test func busyPoolAnswersWithATimeoutNotAQueue() async throws {
        let database = try await TestDatabase.create(poolSize: 1)
        defer { Task { await database.drop() } }
        let pool = PostgresPool(
            settings: try ConnectionSettings(conninfo: database.url, environment: [:]),
            configuration: .init(size: 1, acquireTimeout: .milliseconds(200)), logger: database.logger)
        // The only connection is busy for 4 s: a second caller must get `.poolTimeout` after about 200 ms, not
        // the connection after 4 s (the bound is loose because other tests load the machine).
        async let slow: Void = pool.withConnection { _ = try $0.query("SELECT pg_sleep(4)") }
        let busy = await DaemonProcess.eventually(timeout: .seconds(10)) { pool.usage.inUse == 1 }
        try #require(busy)
        let started = ContinuousClock.now
        let error = await #expect(throws: PostgresError.self) {
            try await pool.withConnection { try $0.query("SELECT 1") }
        }
        #expect(error?.code == .poolTimeout)
        #expect(ContinuousClock.now - started < .milliseconds(2500))
        try await slow
        #expect(pool.usage.waiting == 0)
        await pool.close()
    }

    @Test func terminatedBackendIsReplacedTransparentlyForRetryableWork() async throws {
        try await withTestDatabase(poolSize: 1) { database in
            let pid = try await database.pool.withConnection { $0.backendPID }
            _ = try await TestDatabase.admin { try $0.query("SELECT pg_terminate_backend($1)", [String(pid)]) }
            try await Task.sleep(for: .milliseconds(100))
            let value = try await database.pool.withConnection(retryOnConnectionLoss: true) {
                try $0.query("SELECT 42").string(0, 0)
            }
            #expect(value == "42")
            #expect(try await database.pool.withConnection { $0.backendPID } != pid)
        }
    }
}

@Suite struct MigrationTests {
    static func freshDatabase() async throws -> (name: String, url: String) {
        let name = "m_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased()
        _ = try await TestDatabase.admin { try $0.execute("CREATE DATABASE \(name)") }
        return (name, TestDatabase.url(try TestDatabase.serverURL(), database: name))
    }

    static func drop(_ name: String) async {
        _ = try? await TestDatabase.admin { try $0.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
    }

    static func migrate(_ url: String, migrator: Migrator = Migrator()) async throws -> [String] {
        let settings = try ConnectionSettings(conninfo: url, environment: [:])
        return try await TestDatabase.blocking.runIfActive {
            try migrator.migrate(on: try PostgresConnection(settings: settings), logger: Logger(label: "test"))
        }
    }

    @Test func secondRunDoesNothing() async throws {
        let (name, url) = try await Self.freshDatabase()
        defer { Task { await Self.drop(name) } }
        #expect(try await Self.migrate(url) == Migration.all.map(\.name))
        #expect(try await Self.migrate(url) == [])
        let settings = try ConnectionSettings(conninfo: url, environment: [:])
        let status = try await TestDatabase.blocking.runIfActive {
            try Migrator().status(on: try PostgresConnection(settings: settings))
        }
        #expect(status.isCurrent)
        #expect(status.latestApplied == Migration.all.last?.name)
    }

    @Test func concurrentRunsApplyEachFileOnce() async throws {
        let (name, url) = try await Self.freshDatabase()
        defer { Task { await Self.drop(name) } }
        async let first = Self.migrate(url)
        async let second = Self.migrate(url)
        async let third = Self.migrate(url)
        let applied = try await [first, second, third]
        // Each migration once, by whichever run took its turn first (they take turns per migration).
        #expect(applied.flatMap { $0 }.sorted() == Migration.all.map(\.name).sorted())
    }

    @Test func changedMigrationIsRefused() async throws {
        let (name, url) = try await Self.freshDatabase()
        defer { Task { await Self.drop(name) } }
        _ = try await Self.migrate(url)
        var edited = Migration.all
        edited[1] = Migration(name: edited[1].name, sql: edited[1].sql + "\n-- edited\n")
        let error = await #expect(throws: MigrationError.self) {
            try await Self.migrate(url, migrator: Migrator(migrations: edited))
        }
        #expect(error?.kind == .changed)
        #expect(error?.errorCode == "migration.changed")
        #expect(error?.message.contains(edited[1].name) == true)
    }

    /// 0001 and 0002 had their first comment line reworded after release: a database that recorded the checksums
    /// of the earlier texts still starts, and a checksum that is neither is still refused.
    @Test func rewordedMigrationCommentsAreAccepted() async throws {
        let (name, url) = try await Self.freshDatabase()
        defer { Task { await Self.drop(name) } }
        _ = try await Self.migrate(url)
        let settings = try ConnectionSettings(conninfo: url, environment: [:])
        func record(_ checksums: [String: String]) async throws {
            try await TestDatabase.blocking.runIfActive {
                let connection = try PostgresConnection(settings: settings)
                for (migration, checksum) in checksums {
                    _ = try connection.query(
                        "UPDATE metricsd_migrations SET checksum = $2 WHERE name = $1", [migration, checksum])
                }
            }
        }
        #expect(Migrator.rewordedChecksums.count == 2)
        try await record(Migrator.rewordedChecksums.mapValues { $0.first! })
        #expect(try await Self.migrate(url) == [])
        try await record(["0002_acknowledgements.sql": String(repeating: "0", count: 64)])
        let changed = await #expect(throws: MigrationError.self) { try await Self.migrate(url) }
        #expect(changed?.kind == .changed)
    }

    @Test func firstMigrationIsExactlyTheContract() throws {
        let first = try #require(Migration.all.first)
        #expect(first.name == "0001_initial.sql")
        for table in ["CREATE TABLE users (", "CREATE TABLE user_settings (", "CREATE TABLE profile_metrics ("] {
            #expect(first.sql.contains(table))
        }
        #expect(
            first.sql.contains(
                "CREATE INDEX profile_metrics_user_computed_at_idx ON profile_metrics (user_id, computed_at DESC);"))
    }

    /// The binary carries `migrations/` (embedded at build time by the EmbedResources plugin); they must not drift apart.
    @Test func embeddedMigrationsMatchTheFiles() throws {
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("migrations")
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".sql") }
            .sorted()
        #expect(files == Migration.all.map(\.name), "the EmbedResources plugin embeds every file of migrations/")
        for migration in Migration.all {
            let text = try String(contentsOf: directory.appendingPathComponent(migration.name), encoding: .utf8)
            #expect(text == migration.sql + "\n", "\(migration.name) differs from the embedded copy")
        }
    }
}
