import Foundation
import HealthMetrics
import Logging
import MetricsdPostgres
import NIOPosix
import Synchronization
import Testing

/// A fresh, migrated database on the PostgreSQL server the README's test command starts, one per test, so tests
/// run in parallel without seeing each other's rows.
///
/// Tests that need it and cannot reach the server **fail**: they never skip.
package struct TestDatabase: Sendable {
    package let name: String
    package let url: String
    package let pool: PostgresPool
    package let logger: Logger

    /// The test server is missing: every test that needs it fails with this error (never skips, and never passes
    /// silently as a shared `#require` failure would for all but the first test).
    package struct MissingServer: Error, CustomStringConvertible {
        package var description: String {
            "METRICSD_TEST_DATABASE_URL is not set: run the tests with the README's test command (scripts/test)"
        }
    }

    /// `METRICSD_TEST_DATABASE_URL`, set by `scripts/test`.
    package static func serverURL() throws -> String {
        guard let url = ProcessInfo.processInfo.environment["METRICSD_TEST_DATABASE_URL"], !url.isEmpty else {
            throw MissingServer()
        }
        return url
    }

    /// The server URL with another database name.
    package static func url(_ serverURL: String, database: String) -> String {
        guard let schemeEnd = serverURL.range(of: "://"),
            let slash = serverURL[schemeEnd.upperBound...].firstIndex(of: "/")
        else { return serverURL + " dbname=\(database)" }
        let rest = serverURL[slash...]
        let query = rest.firstIndex(of: "?").map { String(rest[$0...]) } ?? ""
        return String(serverURL[..<slash]) + "/" + database + query
    }

    /// Threads for the tests' own blocking libpq calls: never the cooperative pool, which the code under test
    /// needs (blocking it starves every `await` in the process).
    package static let blocking: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 8)
        pool.start()
        return pool
    }()

    /// Runs `body` with a new connection to the server's `postgres` database, on a blocking thread.
    package static func admin<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T) async throws
        -> T
    {
        let settings = try ConnectionSettings(conninfo: try serverURL(), environment: [:])
        return try await Self.blocking.runIfActive {
            let connection = try PostgresConnection(settings: settings)
            return try body(connection)
        }
    }

    private static let templateName: String = {
        var hash: UInt64 = 1_469_598_103_934_665_603
        for migration in Migration.all {
            for byte in Array(migration.name.utf8) + Array(migration.sql.utf8) {
                hash = (hash ^ UInt64(byte)) &* 1_099_511_628_211
            }
        }
        return "metricsd_template_" + String(hash, radix: 16)
    }()

    private static let templateReady = Mutex<Task<Void, any Error>?>(nil)

    /// Creates (once per test process) a migrated template database, copied for every test.
    private static func ensureTemplate() async throws {
        let task = Self.templateReady.withLock { task in
            if let task { return task }
            let created = Task {
                let server = try Self.serverURL()
                let name = Self.templateName
                let exists = try await Self.admin { connection in
                    try connection.query("SELECT 1 FROM pg_database WHERE datname = $1", [name]).rowCount == 1
                }
                if exists { return }
                let building = name + "_building_\(getpid())"
                try await Self.admin { connection in
                    try connection.execute("DROP DATABASE IF EXISTS \(building)")
                    try connection.execute("CREATE DATABASE \(building)")
                }
                let settings = try ConnectionSettings(conninfo: Self.url(server, database: building), environment: [:])
                try await Self.blocking.runIfActive {
                    let connection = try PostgresConnection(settings: settings)
                    try Migrator().migrate(on: connection, logger: Logger(label: "test"))
                }
                try await Self.admin { connection in
                    do {
                        try connection.execute("ALTER DATABASE \(building) RENAME TO \(name)")
                    } catch let error as PostgresError where error.sqlState == "42P04" {
                        try connection.execute("DROP DATABASE \(building)")  // another run made it meanwhile
                    }
                }
            }
            task = created
            return created
        }
        try await task.value
    }

    /// A new database with the current schema and no rows.
    package static func create(poolSize: Int = 4) async throws -> TestDatabase {
        try await Self.ensureTemplate()
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        let template = Self.templateName
        try await Self.admin { connection in
            // Concurrent copies of one template conflict briefly ("being accessed by other users"): retry.
            var attempt = 0
            while true {
                do {
                    try connection.execute("CREATE DATABASE \(name) TEMPLATE \(template)")
                    return
                } catch let error as PostgresError where error.sqlState == "55006" && attempt < 50 {
                    attempt += 1
                    usleep(100_000)
                }
            }
        }
        let url = Self.url(try Self.serverURL(), database: name)
        let logger = Logger(label: "test")
        let pool = PostgresPool(
            settings: try ConnectionSettings(conninfo: url, environment: [:]),
            configuration: .init(size: poolSize), logger: logger)
        return TestDatabase(name: name, url: url, pool: pool, logger: logger)
    }

    /// A new database migrated with `migrations` only: the schema an install had before a later migration, to test
    /// what that migration does to the rows it finds. ``migrate(_:)`` applies the rest.
    package static func create(migrations: [Migration], poolSize: Int = 4) async throws -> TestDatabase {
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        try await Self.admin { try $0.execute("CREATE DATABASE \(name)") }
        let url = Self.url(try Self.serverURL(), database: name)
        let logger = Logger(label: "test")
        let pool = PostgresPool(
            settings: try ConnectionSettings(conninfo: url, environment: [:]),
            configuration: .init(size: poolSize), logger: logger)
        let database = TestDatabase(name: name, url: url, pool: pool, logger: logger)
        _ = try await database.migrate(Migrator(migrations: migrations))
        return database
    }

    /// Applies `migrator`'s pending migrations (by default every one this build has); returns their names.
    package func migrate(_ migrator: Migrator = Migrator()) async throws -> [String] {
        let logger = self.logger
        return try await self.pool.withConnection { connection in
            try migrator.migrate(on: connection, logger: logger)
        }
    }

    /// Closes the pool and drops the database.
    package func drop() async {
        await self.pool.close()
        let name = self.name
        _ = try? await Self.admin { connection in
            try connection.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)")
        }
    }

    /// Runs SQL (no parameters) on the test database.
    package func execute(_ sql: String) async throws {
        try await self.pool.withConnection { try $0.execute(sql) }
    }

    /// Runs a query and returns its rows as text.
    package func rows(_ sql: String, _ parameters: [String?] = []) async throws -> [[String?]] {
        try await self.pool.withConnection { connection in
            let result = try connection.query(sql, parameters)
            return (0..<result.rowCount).map { row in (0..<result.columnCount).map { result.string(row, $0) } }
        }
    }

    /// The single value of a one-row, one-column query.
    package func value(_ sql: String, _ parameters: [String?] = []) async throws -> String? {
        try await self.rows(sql, parameters).first?.first ?? nil
    }
}

/// Runs `body` with a fresh database and drops it afterwards, whatever happens.
package func withTestDatabase<T>(poolSize: Int = 4, _ body: (TestDatabase) async throws -> T) async throws -> T {
    try await withCleanup(try await TestDatabase.create(poolSize: poolSize), cleanup: { await $0.drop() }, body)
}

/// Runs `body` with `database` (made by the caller, e.g. an upgraded install) and drops it afterwards, whatever
/// happens.
package func withTestDatabase<T>(_ database: TestDatabase, _ body: (TestDatabase) async throws -> T) async throws -> T {
    try await withCleanup(database, cleanup: { await $0.drop() }, body)
}

/// Runs `body` with the URL of a new database that has no schema at all; drops it afterwards.
package func withEmptyDatabase<T>(_ body: (String) async throws -> T) async throws -> T {
    let name = "e_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
    try await TestDatabase.admin { try $0.execute("CREATE DATABASE \(name)") }
    let drop = {
        _ = try? await TestDatabase.admin { try $0.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
    }
    do {
        let value = try await body(TestDatabase.url(try TestDatabase.serverURL(), database: name))
        await drop()
        return value
    } catch {
        await drop()
        throw error
    }
}
