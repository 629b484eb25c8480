import Glibc
import Logging
import Synchronization

extension Migrator {
    /// A claim on a migration outside a transaction not renewed for this long belongs to an instance that died.
    static let claimStaleSeconds = 60
    /// How often the claiming instance renews its claim.
    static let claimRenewalSeconds = 5

    /// Claims `migration` (waiting while another instance holds a live claim), runs it statement by statement and
    /// records it. Returns false when another instance applied it meanwhile.
    func applyOutsideTransaction(
        _ migration: Migration, on connection: PostgresConnection, logger: Logger, beforeStatement: () -> Void
    ) throws -> Bool {
        let holder = String(UInt64.random(in: 1...UInt64.max), radix: 16)
        guard try self.claim(migration, holder: holder, on: connection, logger: logger) else { return false }
        logger.info("Applying migration", metadata: ["metricsd.migration": "\(migration.name)"])
        let renewer = MigrationClaimRenewer(
            settings: connection.settings, name: migration.name, holder: holder, everySeconds: Self.claimRenewalSeconds)
        defer { renewer.stop() }
        do {
            let session = try self.session(for: migration, on: connection)
            try self.applyStatementByStatement(migration, on: session, logger: logger, beforeStatement: beforeStatement)
        } catch {
            // Given up: the next run (this instance's or another's) need not wait for the claim to go stale.
            _ = try? connection.query(
                "DELETE FROM metricsd_migration_claims WHERE name = $1 AND holder = $2", [migration.name, holder])
            throw error
        }
        try connection.transaction { connection in
            try Self.lock(on: connection)
            let released = try connection.query(
                "DELETE FROM metricsd_migration_claims WHERE name = $1 AND holder = $2 RETURNING 1",
                [migration.name, holder])
            guard released.rowCount == 1 else {
                throw MigrationError(
                    .failed,
                    "migration \(migration.name): another instance took it over (this one's claim was not renewed for \(Self.claimStaleSeconds) s); run metricsd migrate again"
                )
            }
            try Self.record(migration, on: connection)
        }
        return true
    }

    /// The session that runs the statements: the migrating connection itself, or through a pooler a session of
    /// ``directSettings`` (without a statement deadline, as the migrating connection's).
    private func session(for migration: Migration, on connection: PostgresConnection) throws -> PostgresConnection {
        guard connection.isPooled else { return connection }
        guard var settings = self.directSettings else {
            throw MigrationError(
                .failed,
                "migration \(migration.name) runs outside a transaction, its statements in one server session, which a transaction-mode pooler does not keep: set METRICSD_NOTIFY_DATABASE_URL to PostgreSQL itself (or a session-mode pool), or run metricsd migrate with DATABASE_URL pointing there"
            )
        }
        settings.statementDeadlineSeconds = nil
        return try PostgresConnection(settings: settings)
    }

    /// Takes the claim on `migration`, trying every 200 ms while another instance holds a live one: between tries
    /// this session runs no statement, so it holds no snapshot that the other instance's `CREATE INDEX
    /// CONCURRENTLY` would wait for. Returns false when the migration is applied by then.
    private func claim(_ migration: Migration, holder: String, on connection: PostgresConnection, logger: Logger) throws
        -> Bool
    {
        var waiting = false
        while true {
            let outcome: Bool? = try connection.transaction { connection in
                try Self.lock(on: connection)
                guard try !Self.isApplied(migration, on: connection) else { return false }
                let taken = try connection.query(
                    """
                    INSERT INTO metricsd_migration_claims (name, holder) VALUES ($1, $2)
                    ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, renewed_at = now()
                    WHERE metricsd_migration_claims.renewed_at < now() - make_interval(secs => $3::int)
                    RETURNING 1
                    """, [migration.name, holder, String(Self.claimStaleSeconds)])
                return taken.rowCount == 1 ? true : nil
            }
            if let outcome { return outcome }
            if !waiting {
                logger.info(
                    "Waiting for another instance's migration", metadata: ["metricsd.migration": "\(migration.name)"])
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
        try Self.liftTimeouts(migration, on: connection)
        defer { if !connection.isPooled { _ = try? connection.execute("RESET lock_timeout; RESET statement_timeout") } }
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

    /// Turns the session's lock and statement timeouts off. Through a pooler a session `SET` would land in one
    /// pooled server session (and stay there for other clients) while the statements run in others: there the
    /// timeouts must already be off (they come from the role's or the database's settings), or the migration stops
    /// before its first statement, saying what to change.
    private static func liftTimeouts(_ migration: Migration, on connection: PostgresConnection) throws {
        guard connection.isPooled else {
            try connection.execute("SET lock_timeout = 0; SET statement_timeout = 0")
            return
        }
        let result = try connection.query(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), current_user")
        let (lock, statement) = (try result.requiredString(0, 0), try result.requiredString(0, 1))
        guard lock == "0" && statement == "0" else {
            throw MigrationError(
                .failed,
                "migration \(migration.name) runs outside a transaction and the connection goes through a pooler, where metricsd cannot turn off lock_timeout (\(lock)) and statement_timeout (\(statement)) for its statements: run metricsd migrate with DATABASE_URL pointing at PostgreSQL itself, or ALTER ROLE \(result.string(0, 2) ?? "metricsd") SET lock_timeout = 0 and SET statement_timeout = 0"
            )
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
                        "metricsd.duration.seconds":
                            "\(((ContinuousClock.now - started) / .milliseconds(1)).rounded() / 1000)",
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
        let line =
            statement.split(whereSeparator: \.isNewline)
            .map { $0.drop(while: \.isWhitespace) }
            .first { !$0.isEmpty && !$0.hasPrefix("--") } ?? ""
        return line.count > 120 ? String(line.prefix(117)) + "..." : String(line)
    }
}

/// Renews a claim on a migration outside a transaction every few seconds from a session and a thread of its own
/// (the migrating session is busy for as long as a statement runs, an index build for hours), until stopped. A
/// failed renewal is tried again at the next turn, on a new session.
final class MigrationClaimRenewer: @unchecked Sendable {  // the thread reads only immutable fields and `stopping`
    private let settings: ConnectionSettings
    private let name: String
    private let holder: String
    private let everySeconds: Int
    private let stopping = Atomic<Bool>(false)
    private var thread = pthread_t()
    private var started = false

    init(settings: ConnectionSettings, name: String, holder: String, everySeconds: Int) {
        self.settings = settings
        self.name = name
        self.holder = holder
        self.everySeconds = everySeconds
        let retained = Unmanaged.passRetained(self).toOpaque()
        self.started =
            pthread_create(
                &self.thread, nil,
                { argument in
                    let renewer = Unmanaged<MigrationClaimRenewer>.fromOpaque(argument!).takeRetainedValue()
                    renewer.renew()
                    return nil
                }, retained) == 0
        if !self.started { Unmanaged<MigrationClaimRenewer>.fromOpaque(retained).release() }
    }

    private func renew() {
        var connection: PostgresConnection?
        var ticks = 0
        while !self.stopping.load(ordering: .acquiring) {
            usleep(100_000)
            ticks += 1
            guard ticks % (self.everySeconds * 10) == 0 else { continue }
            do {
                let session = try connection ?? PostgresConnection(settings: self.settings)
                connection = session
                try session.query(
                    "UPDATE metricsd_migration_claims SET renewed_at = now() WHERE name = $1 AND holder = $2",
                    [self.name, self.holder])
            } catch {
                connection = nil
            }
        }
    }

    /// Stops renewing and waits for the thread (at most one renewal in flight).
    func stop() {
        self.stopping.store(true, ordering: .releasing)
        if self.started { pthread_join(self.thread, nil) }
        self.started = false
    }
}
