import HealthMetrics
import Logging

/// One ordered, forward-only schema change (`migrations/NNNN_name.sql`, embedded in the binary).
public struct Migration: Sendable, Hashable {
    public let name: String
    public let sql: String

    public init(name: String, sql: String) {
        self.name = name
        self.sql = sql
    }

    /// The line that makes a migration run outside a transaction, statement by statement.
    public static let outsideTransactionMarker = "-- metricsd:no-transaction"

    /// Whether the file has ``outsideTransactionMarker`` as a line of its own: its statements run one by one, each
    /// committed on its own (`MigrationScript`), for what PostgreSQL refuses inside a transaction, such as
    /// `CREATE INDEX CONCURRENTLY`.
    public var runsOutsideTransaction: Bool {
        self.sql.split(whereSeparator: \.isNewline).contains { line in
            line.drop(while: \.isWhitespace).reversed().drop(while: \.isWhitespace).reversed()
                .elementsEqual(Self.outsideTransactionMarker)
        }
    }
}

/// Where the database's schema stands relative to this build.
public struct SchemaStatus: Sendable, Equatable {
    /// Migrations of this build not applied yet, in order.
    public let pending: [String]
    /// Applied migrations this build does not know (a newer metricsd migrated the database).
    public let unknown: [String]
    /// Applied migrations whose text differs from this build's (edited after being applied).
    public let changed: [String]
    /// The last applied migration, nil on an empty database.
    public let latestApplied: String?

    public var isCurrent: Bool { self.pending.isEmpty && self.changed.isEmpty }

    package init(pending: [String], unknown: [String], changed: [String], latestApplied: String?) {
        self.pending = pending
        self.unknown = unknown
        self.changed = changed
        self.latestApplied = latestApplied
    }
}

/// Applies `migrations/` in order, each in its own transaction, recorded with its checksum in
/// `metricsd_migrations`. Concurrent runs (several instances starting at once) take turns on a transaction-scoped
/// advisory lock taken inside each migration's transaction, which also checks whether the migration was applied
/// meanwhile: the second run finds everything applied and does nothing. A lock of the transaction's own survives a
/// transaction-mode pooler (the transaction runs in one server session) and ends with it whatever happens; a session
/// lock would be taken in one pooled server session, the work done in others, and left held. A migration whose text
/// changed after it was applied stops everything with an error naming it.
///
/// A migration marked ``Migration/outsideTransactionMarker`` runs statement by statement instead, each committed
/// on its own (`MigrationScript` says how the file is split): for `CREATE INDEX CONCURRENTLY` and the like, which
/// PostgreSQL refuses inside a transaction, on tables that must stay writable while they run. It is recorded only
/// after its last statement, so a run that stops half-way (a crash, a failed statement) starts it again from its
/// first statement next time: each statement must find what an earlier run already did and leave it (`IF NOT
/// EXISTS`, a query that generates only what is missing, an invalid index from an interrupted build dropped
/// first). A statement that gives up waiting for a lock (SQLSTATE 55P03, under a `lock_timeout` the statement
/// sets itself) is tried again after a pause, so that a strong lock is never queued for long in front of other
/// sessions. Such a migration cannot hold a transaction's lock while it runs, so an instance claims it first: a row
/// in `metricsd_migration_claims` (written under the lock), renewed every few seconds from a session of its own
/// while the statements run and removed when the migration is recorded. Another instance waits for the claim by
/// polling, never inside a statement (a statement waiting would hold a snapshot, which `CREATE INDEX CONCURRENTLY`
/// in the claiming instance waits for: a deadlock); a claim not renewed for ``claimStaleSeconds`` (its instance
/// died) is taken over, and its migration started again from its first statement.
public struct Migrator: Sendable {
    /// The advisory lock key: `hashtext('metricsd.migrate')` would do too, but a constant is easy to look up in
    /// `pg_locks` (classid 0x6d657472 'metr', objid 0x69637364 'icsd').
    static let lockKey: Int64 = 0x6d65_7472_6963_7364

    public let migrations: [Migration]
    /// A session past the pooler (`METRICSD_NOTIFY_DATABASE_URL`) for migrations outside a transaction when the
    /// migrating connection goes through a pooler: their statements need one server session from first to last
    /// (a session-local function in `pg_temp`, the session's timeouts), which a transaction pooler does not keep.
    public let directSettings: ConnectionSettings?
    /// How long to wait before trying a statement again that gave up waiting for a lock, and how many times.
    let lockRetryPause: Duration
    let lockRetries: Int

    public init(
        migrations: [Migration] = Migration.all, lockRetryPause: Duration = .seconds(2), lockRetries: Int = 150,
        directSettings: ConnectionSettings? = nil
    ) {
        self.migrations = migrations
        self.directSettings = directSettings
        self.lockRetryPause = lockRetryPause
        self.lockRetries = lockRetries
    }

    /// Reads which migrations are applied, without changing anything.
    public func status(on connection: PostgresConnection) throws -> SchemaStatus {
        let exists = try connection.query("SELECT to_regclass('metricsd_migrations') IS NOT NULL")
        let applied: [(name: String, checksum: String)]
        if try exists.bool(0, 0) {
            let result = try connection.query("SELECT name, checksum FROM metricsd_migrations ORDER BY name")
            applied = try (0..<result.rowCount).map {
                (try result.requiredString($0, 0), try result.requiredString($0, 1))
            }
        } else {
            applied = []
        }
        let known = Dictionary(uniqueKeysWithValues: self.migrations.map { ($0.name, $0) })
        var changed: [String] = []
        for row in applied {
            if let migration = known[row.name], try Self.checksum(migration.sql, on: connection) != row.checksum,
                !(Self.rewordedChecksums[row.name] ?? []).contains(row.checksum)
            {
                changed.append(row.name)
            }
        }
        let appliedNames = Set(applied.map(\.name))
        return SchemaStatus(
            pending: self.migrations.map(\.name).filter { !appliedNames.contains($0) },
            unknown: applied.map(\.name).filter { known[$0] == nil },
            changed: changed,
            latestApplied: applied.last?.name)
    }

    /// The migrations of this build not applied yet: one cheap query, for `/readyz` (checksums are verified at
    /// start-up and by `migrate`).
    public func pending(on connection: PostgresConnection) throws -> [String] {
        let exists = try connection.prepared(
            "migrations_table_exists", "SELECT to_regclass('metricsd_migrations') IS NOT NULL", [])
        guard try exists.bool(0, 0) else { return self.migrations.map(\.name) }  // never migrated
        let result = try connection.prepared(
            "applied_migrations", "SELECT coalesce(array_to_string(array_agg(name), ','), '') FROM metricsd_migrations",
            [])
        let names = try result.requiredString(0, 0)
        let applied = Set(names.split(separator: ",").map(String.init))
        return self.migrations.map(\.name).filter { !applied.contains($0) }
    }

    /// Applies every pending migration. `beforeStep` runs before each one (systemd's `EXTEND_TIMEOUT_USEC`).
    /// - Returns: the names applied by this call (empty when the schema was already current).
    @discardableResult
    public func migrate(
        on connection: PostgresConnection, logger: Logger, beforeStep: (String, Int, Int) -> Void = { _, _, _ in }
    ) throws -> [String] {
        // Waiting for another instance's migration and building indexes may take long: no statement deadline.
        let deadline = connection.statementDeadlineSeconds
        connection.statementDeadlineSeconds = nil
        defer { connection.statementDeadlineSeconds = deadline }
        try connection.transaction { connection in
            try Self.lock(on: connection)
            try connection.execute(
                """
                CREATE TABLE IF NOT EXISTS metricsd_migrations (
                  name       TEXT PRIMARY KEY,
                  checksum   TEXT NOT NULL,
                  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
                );
                CREATE TABLE IF NOT EXISTS metricsd_migration_claims (
                  name       TEXT PRIMARY KEY,
                  holder     TEXT NOT NULL,
                  renewed_at TIMESTAMPTZ NOT NULL DEFAULT now()
                )
                """)
        }
        let status = try self.status(on: connection)
        if let first = status.changed.first {
            throw MigrationError(
                .changed,
                "migration \(first) was changed after it was applied; restore the original file and add a new migration instead"
            )
        }
        var applied: [String] = []
        for (index, name) in status.pending.enumerated() {
            guard let migration = self.migrations.first(where: { $0.name == name }) else { continue }
            beforeStep(name, index + 1, status.pending.count)
            let done: Bool
            do {
                if migration.runsOutsideTransaction {
                    done = try self.applyOutsideTransaction(migration, on: connection, logger: logger) {
                        beforeStep(name, index + 1, status.pending.count)
                    }
                } else {
                    done = try connection.transaction { connection in
                        try Self.lock(on: connection)
                        guard try !Self.isApplied(migration, on: connection) else { return false }
                        logger.info("Applying migration", metadata: ["metricsd.migration": "\(name)"])
                        try connection.execute(migration.sql)
                        try Self.record(migration, on: connection)
                        return true
                    }
                }
            } catch let error as PostgresError {
                throw MigrationError(.failed, "migration \(name) failed: \(error)")
            }
            if done { applied.append(name) }
        }
        return applied
    }

    /// Waits for and takes the migration lock of the transaction in progress (released at its end).
    static func lock(on connection: PostgresConnection) throws {
        try connection.query("SELECT pg_advisory_xact_lock($1)", [String(Self.lockKey)])
    }

    /// Whether `migration` is recorded as applied (by another instance while this one waited); one recorded with
    /// another text throws `.changed`.
    static func isApplied(_ migration: Migration, on connection: PostgresConnection) throws -> Bool {
        let result = try connection.query("SELECT checksum FROM metricsd_migrations WHERE name = $1", [migration.name])
        guard result.rowCount > 0, let recorded = result.string(0, 0) else { return false }
        if try Self.checksum(migration.sql, on: connection) != recorded,
            !(Self.rewordedChecksums[migration.name] ?? []).contains(recorded)
        {
            throw MigrationError(
                .changed,
                "migration \(migration.name) was changed after it was applied; restore the original file and add a new migration instead"
            )
        }
        return true
    }

    /// Checksums of earlier texts of migrations whose comments were reworded later (the statements are the same),
    /// so a database migrated by an earlier release is not reported as "changed". Never add a migration here whose
    /// statements changed: that needs a new migration.
    static let rewordedChecksums: [String: Set<String>] = [
        "0001_initial.sql": ["974ae9c9f53e61857966d5eb592423c464b7b9fe37c17987f13d0cbae9763269"],
        "0002_acknowledgements.sql": ["71d5aa71e3ad0c4cbc3d181fbc145db5ad28f27bdee6aa5ed15da9d1de422b38"],
    ]

    static func record(_ migration: Migration, on connection: PostgresConnection) throws {
        try connection.query(
            "INSERT INTO metricsd_migrations (name, checksum) VALUES ($1, encode(sha256(convert_to($2, 'UTF8')), 'hex'))",
            [migration.name, migration.sql])
    }

    static func checksum(_ sql: String, on connection: PostgresConnection) throws -> String {
        try connection.query("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')", [sql]).requiredString(0, 0)
    }
}

/// A migration could not be applied; the message names it and says what to do.
public struct MigrationError: CodedError, Sendable {
    public enum Kind: String, CaseIterable, Sendable {
        /// An applied migration's file differs from what was applied (its checksum).
        case changed = "migration.changed"
        /// A migration's statements failed; its transaction was rolled back.
        case failed = "migration.failed"
    }

    public let kind: Kind
    public let message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var errorCode: String { self.kind.rawValue }
    public var description: String { self.message }
}
