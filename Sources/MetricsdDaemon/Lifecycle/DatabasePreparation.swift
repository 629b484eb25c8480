import Glibc
import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdReads
import MetricsdSystemd
import ServiceLifecycle

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A start-up failure that ends the daemon: its case, one line for the operator and the `errno` systemd records.
package struct StartupError: CodedError {
    package enum Kind: String, CaseIterable, Sendable {
        /// An applied migration's file differs from what was applied (the same code as ``MigrationError``'s).
        case migrationChanged = "migration.changed"
        /// A migration failed during `serve --migrate` (the same code as ``MigrationError``'s).
        case migrationFailed = "migration.failed"
        /// Migrations are pending and `--migrate` was not given.
        case schemaBehind = "schema.behind"
        /// The HTTP (or metrics) listener could not be opened.
        case listenFailed = "startup.listen_failed"
        /// A service of the daemon failed (the message says which and why).
        case serviceFailed = "daemon.service_failed"
    }

    package let kind: Kind
    package let message: String
    package let errno: Int32

    package init(_ kind: Kind, message: String, errno: Int32) {
        self.kind = kind
        self.message = message
        self.errno = errno
    }

    package var errorCode: String { self.kind.rawValue }
    package var description: String { self.message }
}

/// The first thing the daemon does: waits for the database (retried with capped backoff, one log line per distinct
/// failure, `STATUS=waiting for database: …`), then checks the schema or, with `--migrate`, migrates it
/// (`EXTEND_TIMEOUT_USEC` before each step); then opens `prepared`, which everything that needs the database waits
/// at. A stop signal during start-up ends it quietly: the gate stays closed and nothing else starts.
///
/// Returns once the database is prepared (the group is told to ignore that).
package struct DatabasePreparation: Service {
    let pool: PostgresPool
    let migrate: Bool
    let notifier: SystemdNotifier
    let prepared: Gate
    let logger: Logger
    /// `METRICSD_NOTIFY_DATABASE_URL`: where migrations outside a transaction run when `DATABASE_URL` is pooled.
    package var directSettings: ConnectionSettings?

    package init(pool: PostgresPool, migrate: Bool, notifier: SystemdNotifier, prepared: Gate, logger: Logger) {
        self.pool = pool
        self.migrate = migrate
        self.notifier = notifier
        self.prepared = prepared
        self.logger = logger
    }

    package func run() async throws {
        do {
            try await cancelWhenGracefulShutdown {
                try await self.waitForDatabase()
                try await self.prepareSchema()
            }
        } catch is CancellationError {
            return  // stopped during start-up
        }
        self.prepared.open()
    }

    private func waitForDatabase() async throws {
        var lastProblem: String?
        var delay = Duration.milliseconds(250)
        while true {
            try Task.checkCancellation()
            do {
                _ = try await self.pool.withConnection { try $0.query("SELECT 1") }
                if lastProblem != nil { self.logger.info("Database reachable") }
                return
            } catch let error as PostgresError where error.code != .badConnectionString {
                let problem = error.message
                if problem != lastProblem {
                    // The reason in the message itself: `journalctl -u metricsd` and `systemctl status` show
                    // only the message (libpq's words, any password in them already masked).
                    self.logger.warning(
                        "Waiting for database: \(problem)", metadata: .errorFields(problem, code: error.errorCode))
                    self.notifier.status("waiting for database: \(problem)")
                    lastProblem = problem
                }
                try await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(10))
            }
        }
    }

    private func prepareSchema() async throws {
        let migrator = Migrator(directSettings: self.directSettings)
        let status = try await self.pool.withConnection { try migrator.status(on: $0) }
        if let changed = status.changed.first {
            throw StartupError(
                .migrationChanged,
                message: "migration \(changed) was changed after it was applied; restore it and add a new migration",
                errno: EINVAL)
        }
        if !status.unknown.isEmpty {
            self.logger.warning(
                "The database has migrations this build does not know (a newer metricsd applied them)",
                metadata: ["metricsd.migrations": "\(status.unknown.joined(separator: ","))"])
        }
        guard !status.pending.isEmpty else { return }
        guard self.migrate else {
            throw StartupError(.schemaBehind, message: PostgresStore.describe(status), errno: EINVAL)
        }
        let notifier = self.notifier
        let logger = self.logger
        notifier.status("migrating: \(status.pending.count) pending")
        let applied = try await self.pool.withConnection { connection in
            try migrator.migrate(on: connection, logger: logger) { name, step, total in
                notifier.extendTimeout(by: .seconds(60))
                notifier.status("migrating \(step)/\(total): \(name)")
            }
        }
        logger.info("Schema migrated", metadata: ["metricsd.migrations": "\(applied.joined(separator: ","))"])
        // The last step's extension may be nearly used up: cover binding the listener and starting the scheduler.
        notifier.extendTimeout(by: .seconds(30))
    }
}
