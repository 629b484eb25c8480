/// A user's newest metrics row and its acknowledgement, as the HTTP API serves them.
public struct LatestMetrics: Hashable, Sendable {
    public let metrics: ComputedMetrics
    /// `computed_at`, millisecond precision.
    public let computedAt: Timestamp
    /// When the user acknowledged exactly this row (same version and `computed_at`), or nil.
    public let acknowledgedAt: Timestamp?
    /// Why the user's current settings give no metrics (every reason, `; `-separated, as the skip record has
    /// them), when the latest verdict on them was that: the row is then an older computation that no longer
    /// matches what the person entered, and is not served as their current metrics. Nil when the settings are
    /// valid.
    public let invalidSettings: String?

    public init(
        metrics: ComputedMetrics, computedAt: Timestamp, acknowledgedAt: Timestamp?, invalidSettings: String? = nil
    ) {
        self.metrics = metrics
        self.computedAt = computedAt
        self.acknowledgedAt = acknowledgedAt
        self.invalidSettings = invalidSettings
    }
}

/// What computing a user's metrics on the spot gave.
public enum ComputeNowOutcome: Hashable, Sendable {
    /// Stored (or found stored by a concurrent writer) and read back.
    case computed(LatestMetrics)
    /// The settings are missing or invalid; every reason.
    case skipped([SkipReason])
    /// No such user.
    case unknownUser
}

/// What acknowledging named metrics gave.
public enum AcknowledgeOutcome: Hashable, Sendable {
    /// The named metrics are the current ones; acknowledged at this instant (the first time, if repeated).
    case acknowledged(at: Timestamp, version: Int)
    /// The user has metrics, but not these (recomputed since, or another version).
    case notCurrent
    /// The user has no metrics at all, and why.
    case noMetrics(NoMetricsReason)
}

/// Why a user has no metrics.
public enum NoMetricsReason: Hashable, Sendable {
    /// No such user.
    case unknownUser
    /// The settings are missing or invalid; every reason.
    case invalidSettings([SkipReason])
    /// The settings are valid, but nothing has computed the user's metrics yet (the first read does).
    case notComputedYet
}

/// Whether the store can serve: the database answers and its schema is this build's.
public struct Readiness: Hashable, Sendable {
    public enum Database: String, Sendable { case ok, unreachable }
    public enum Schema: String, Sendable { case current, behind, unknown }
    public let database: Database
    public let schema: Schema
    /// Why not ready, one line; nil when ready.
    public let reason: String?

    public init(database: Database, schema: Schema, reason: String?) {
        self.database = database
        self.schema = schema
        self.reason = reason
    }

    public var isReady: Bool { self.database == .ok && self.schema == .current }
}

/// The storage port of the HTTP API. `PostgresStore` (MetricsdReads) implements it over libpq; HTTP-shape tests use
/// an in-memory double.
public protocol MetricsStore: Sendable {
    /// The newest row by `computed_at DESC` (the greater id between equal ones), never by date: the user's first
    /// entry in `profile_metrics_user_computed_at_idx`, kept in `profile_metrics_latest`.
    func latestMetrics(userID: Int64) async throws -> LatestMetrics?
    /// The same read for a caller outside Swift concurrency (the HTTP hot path, on an event loop): `completion`
    /// runs exactly once, on any thread, and the read never blocks the caller.
    func latestMetrics(userID: Int64, completion: @escaping @Sendable (Result<LatestMetrics?, any Error>) -> Void)
    /// Validates the user's settings and stores the row for their current local date (a just-onboarded user).
    func computeNow(userID: Int64) async throws -> ComputeNowOutcome
    /// Acknowledges the user's current metrics if they are the ones named.
    func acknowledge(userID: Int64, version: Int, computedAt: Timestamp) async throws -> AcknowledgeOutcome
    /// Whether the database answers and the schema is current (`/readyz`).
    func readiness() async -> Readiness
}
