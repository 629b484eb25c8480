import Glibc
import Logging

extension Migrator {
    /// Takes the migration lock, trying every 200 ms: between tries this session runs no statement, so it holds no
    /// snapshot that another instance's `CREATE INDEX CONCURRENTLY` would wait for.
    func takeTurn(on connection: PostgresConnection, logger: Logger) throws {
        var waiting = false
        while try !connection.query("SELECT pg_try_advisory_lock($1)", [String(Self.lockKey)]).bool(0, 0) {
            if !waiting {
                logger.info("Waiting for another instance's migration")
                waiting = true
            }
            usleep(200_000)
        }
    }

    /// Runs a migration marked ``Migration/outsideTransactionMarker``: its statements one by one, each committed on
    /// its own, and those a `\gexec` query returns in their turn. `beforeStatement` runs before each (systemd's
    /// start-up timeout is extended per statement). The session's own lock and statement timeouts (from the role's
    /// or the database's settings) are off meanwhile: a `CREATE INDEX CONCURRENTLY` given up half-way leaves an
    /// invalid index behind, and on a large table it may take longer than any such timeout. A statement that must
    /// not wait long sets its own `lock_timeout`.
    func applyStatementByStatement(
        _ migration: Migration, on connection: PostgresConnection, logger: Logger, beforeStatement: () -> Void
    ) throws {
        try connection.execute("SET lock_timeout = 0; SET statement_timeout = 0")
        defer { _ = try? connection.execute("RESET lock_timeout; RESET statement_timeout") }
        for step in MigrationScript.steps(of: migration.sql) {
            beforeStatement()
            let result = try self.run(step.sql, of: migration, on: connection, logger: logger)
            guard step.generatesStatements, let result else { continue }
            for row in 0..<result.rowCount {
                for column in 0..<result.columnCount {
                    guard let statement = result.string(row, column) else { continue }
                    beforeStatement()
                    _ = try self.run(statement, of: migration, on: connection, logger: logger)
                }
            }
        }
    }

    /// One statement, tried again after ``lockRetryPause`` while it fails for want of a lock (55P03), at most
    /// ``lockRetries`` times. Logs each with how long it took.
    private func run(_ statement: String, of migration: Migration, on connection: PostgresConnection, logger: Logger)
        throws -> PostgresResult?
    {
        let summary = Self.summary(of: statement)
        var attempt = 1
        while true {
            let started = ContinuousClock.now
            let outcome = Result { () throws(PostgresError) -> PostgresResult? in try connection.query(statement) }
            switch outcome {
            case .success(let result):
                logger.info(
                    "Applied migration statement",
                    metadata: [
                        "metricsd.migration": "\(migration.name)", "metricsd.statement": "\(summary)",
                        "metricsd.duration.seconds": "\(((ContinuousClock.now - started) / .milliseconds(1)).rounded() / 1000)",
                    ])
                return result
            case .failure(let error):
                guard error.sqlState == "55P03" && attempt < self.lockRetries else { throw error }
                logger.warning(
                    "Migration statement gave up waiting for a lock; trying again",
                    metadata: [
                        "metricsd.migration": "\(migration.name)", "metricsd.statement": "\(summary)",
                        "metricsd.attempt": "\(attempt)", "metricsd.error": "\(error)",
                    ])
                attempt += 1
                usleep(UInt32(self.lockRetryPause / .microseconds(1)))
            }
        }
    }

    /// The statement's first line of code (after its comments), cut at 120 characters, for the log.
    static func summary(of statement: String) -> String {
        let line = statement.split(whereSeparator: \.isNewline)
            .map { $0.drop(while: \.isWhitespace) }
            .first { !$0.isEmpty && !$0.hasPrefix("--") } ?? ""
        return line.count > 120 ? String(line.prefix(117)) + "..." : String(line)
    }
}
