import HealthMetrics
import Logging
import MetricsdHTTP
import MetricsdMasking
import MetricsdPostgres
import MetricsdReads
import MetricsdSystemd
import MetricsdTracing
import MetricsdWork
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Everything `metricsd serve` is configured with, read once at start-up from the environment and systemd
/// credentials (README, "Configuration"). Invalid values are reported as one clear `ConfigurationError`.
public struct Configuration: Sendable {
    /// The database connections (``DatabaseSettings``).
    public var database: DatabaseSettings
    /// `METRICSD_LISTEN`, default `127.0.0.1:8080`.
    public var listen: ListenAddress
    /// `METRICSD_INTERNAL_LISTEN` (former name `METRICSD_METRICS_LISTEN`): the internal listener, for `/metrics`,
    /// the admin API and the health checks (the public one then serves neither `/metrics` nor the admin API); nil
    /// serves everything on the public listener. Under socket activation a socket named `internal` is used instead.
    public var internalListen: ListenAddress?
    /// `METRICSD_TRUSTED_PROXIES`: the peers whose forwarded-address header names the client in the request log;
    /// `METRICSD_FORWARDED_HEADER` (default `x-forwarded-for`) is that header, the other is ignored.
    public var trustedProxies: TrustedProxies
    /// `METRICSD_TLS` and the certificate and key (credentials `tls-certificate`, `tls-key`); nil: plain HTTP.
    public var tls: TLSSettings?
    /// `METRICSD_DAILY_AT`, default `00:05`.
    public var dailyAt: DailyTime
    /// `METRICSD_LOG_LEVEL`, default `info`.
    public var logLevel: Logger.Level
    /// `METRICSD_LOG_FORMAT` (`text`, `json`, `journal`); nil chooses the journal under systemd, else text.
    public var logFormat: LogFormat?
    /// `METRICSD_REQUEST_LOG` (`off`, `errors`, `all`), default `errors`: which requests get a request log line.
    public var requestLog: RequestLogMode
    /// Token verification (JWT secret or public key, issuer, audience, leeway).
    public var tokens: TokenConfiguration
    /// The admin bearer token; nil serves no admin endpoint at all.
    public var adminToken: String?
    /// `METRICSD_DB_POOL_SIZE`, default 8.
    public var poolSize: Int
    /// `METRICSD_READ_BATCHES`: latest-metrics reads run as at most this many batched statements at once
    /// (default 2, at most the pool size); another starts only when a whole batch waits, else requests join the
    /// next batch.
    public var readBatches: Int
    /// `METRICSD_DB_ACQUIRE_TIMEOUT_MS`: how long a request waits for a free connection before a 503. Default 2000.
    public var acquireTimeout: Duration
    /// `METRICSD_DB_SESSION_MAX_AGE`: seconds a pooled database session is used before it is replaced by a new
    /// one, default 600. PostgreSQL sessions keep a time zone's rules once loaded, so this bounds how long the
    /// daemon follows old rules after a tz database update on the server.
    public var sessionMaxAge: Duration
    /// `METRICSD_WORKERS`: chunks this instance works on at once, default 2.
    public var workers: Int
    /// `METRICSD_BATCH_SIZE` (users per transaction, default 1000), `METRICSD_CHUNK_SIZE` (users per claim,
    /// default 5000), `METRICSD_LEASE_SECONDS` (default 60).
    public var work: WorkQueue.Configuration
    /// `METRICSD_TICK_SECONDS`: how often the scheduler asks which zones are due, default 60 (aligned to the minute).
    public var tick: Duration
    /// `METRICSD_IDLE_POLL_SECONDS`: how often idle workers look for work queued by others, default 2.
    public var idlePoll: Duration
    /// `METRICSD_RETENTION_DAYS`: metrics rows computed more than this many days ago are removed in the
    /// background (each user's newest row of each version stays); 0, the default, keeps everything.
    public var retentionDays: Int
    /// `METRICSD_HISTORY_MOVE` (`on`, `off`), default `on`: this instance takes part in moving the history an
    /// upgrade left in the old partition of `profile_metrics` into monthly partitions.
    public var historyMove: Bool
    /// `METRICSD_SHUTDOWN_SECONDS`: how long SIGTERM waits for requests and the current batch, default 20
    /// (below the unit's `TimeoutStopSec=30s`).
    public var shutdown: Duration
    /// `METRICSD_HTTP_REQUEST_TIMEOUT_SECONDS`: a request's head and body must each arrive within this, default 10.
    public var requestTimeout: Duration
    /// `METRICSD_HTTP_IDLE_TIMEOUT_SECONDS`: an idle keep-alive connection is closed after this, default 60.
    public var idleTimeout: Duration
    /// `METRICSD_HTTP_WRITE_TIMEOUT_SECONDS`: a reply the client does not take within this closes the
    /// connection, default 10.
    public var writeTimeout: Duration
    /// `METRICSD_MAX_CONNECTIONS`: open HTTP connections accepted at once, default 1024.
    public var maxConnections: Int
    /// `METRICSD_INTERNAL_MAX_CONNECTIONS`: open connections accepted at once on the internal listener, default 64
    /// (its clients are Prometheus and the operator's tools), counted apart from the public ones.
    public var internalMaxConnections: Int
    /// `METRICSD_MAX_IN_FLIGHT`: requests handled at once; beyond it a request gets an immediate 503 with
    /// `Retry-After`. Default 8 × `METRICSD_DB_POOL_SIZE` (64), at most `METRICSD_MAX_CONNECTIONS`: every request
    /// needs the database, so more in flight only wait, and under overload (the fault-injection suite: 512
    /// connections) they waited up to 10 s instead of getting a fast 503.
    public var maxInFlight: Int
    /// `METRICSD_TEST_FORMULA_VERSION` (testing and rehearsals only): the formulas labelled with this version.
    public var formula: MetricsFormula
    /// Tracing (`OTEL_TRACES_EXPORTER=otlp` and the other `OTEL_*` variables); nil: off, the default.
    public var tracing: TracingSettings?

    /// Reads the configuration.
    /// - Parameter environment: the process environment (tests pass their own).
    public init(environment: [String: String]) throws(ConfigurationError) {
        let reader = EnvironmentReader(environment)
        self.database = try DatabaseSettings(reader, environment: environment)
        let listeners = try ListenerSettings(reader)
        (self.listen, self.internalListen) = (listeners.listen, listeners.internalListen)
        self.trustedProxies = listeners.trustedProxies
        self.tls = try Self.tlsSettings(listeners, environment: environment)
        self.dailyAt = try reader.parse("METRICSD_DAILY_AT", expected: "HH:MM, e.g. 00:05") {
            DailyTime(parsing: $0)
        }
        self.logLevel = try reader.parse(
            "METRICSD_LOG_LEVEL", expected: "one of trace, debug, info, notice, warning, error, critical"
        ) { Logger.Level(rawValue: $0.lowercased()) }
        self.logFormat = try reader.parseOptional("METRICSD_LOG_FORMAT", expected: "text, json or journal") {
            LogFormat(rawValue: $0.lowercased())
        }
        self.requestLog = try reader.parse("METRICSD_REQUEST_LOG", expected: "off, errors or all") {
            RequestLogMode(rawValue: $0.lowercased())
        }
        self.tokens = try TokenConfiguration(environment: environment)
        self.adminToken = try Self.adminToken(environment: environment, tokens: self.tokens)
        self.poolSize = try reader.integer("METRICSD_DB_POOL_SIZE")
        // The catalogue's default, or the pool size when the pool is smaller.
        self.readBatches = try reader.integer(
            "METRICSD_READ_BATCHES",
            default: min(SettingsCatalog.integerDefault("METRICSD_READ_BATCHES"), self.poolSize),
            range: 1...self.poolSize)
        self.acquireTimeout = .milliseconds(try reader.integer("METRICSD_DB_ACQUIRE_TIMEOUT_MS"))
        self.sessionMaxAge = try reader.duration("METRICSD_DB_SESSION_MAX_AGE")
        self.workers = try reader.integer("METRICSD_WORKERS")
        var work = WorkQueue.Configuration()
        work.batchSize = try reader.integer("METRICSD_BATCH_SIZE")
        work.chunkSize = try reader.integer("METRICSD_CHUNK_SIZE")
        work.leaseSeconds = try reader.number("METRICSD_LEASE_SECONDS")
        self.work = work
        self.tick = try reader.duration("METRICSD_TICK_SECONDS")
        self.idlePoll = try reader.duration("METRICSD_IDLE_POLL_SECONDS")
        self.retentionDays = try reader.integer("METRICSD_RETENTION_DAYS")
        self.historyMove = try reader.parse("METRICSD_HISTORY_MOVE", default: true, expected: "on or off") {
            ["on": true, "off": false][$0.lowercased()]
        }
        self.shutdown = try reader.duration("METRICSD_SHUTDOWN_SECONDS")
        self.requestTimeout = try reader.duration("METRICSD_HTTP_REQUEST_TIMEOUT_SECONDS")
        self.idleTimeout = try reader.duration("METRICSD_HTTP_IDLE_TIMEOUT_SECONDS")
        self.writeTimeout = try reader.duration("METRICSD_HTTP_WRITE_TIMEOUT_SECONDS")
        self.maxConnections = try reader.integer("METRICSD_MAX_CONNECTIONS")
        self.internalMaxConnections = try reader.integer("METRICSD_INTERNAL_MAX_CONNECTIONS")
        self.maxInFlight = try reader.integer(
            "METRICSD_MAX_IN_FLIGHT", default: min(self.maxConnections, 8 * self.poolSize), range: 1...100_000)
        let testVersion = try reader.parseOptional("METRICSD_TEST_FORMULA_VERSION", expected: "a version number") {
            Int($0).flatMap { $0 >= MetricsFormula.current.version ? $0 : nil }
        }
        self.formula = testVersion.map { MetricsFormula.rehearsal(version: $0) } ?? .current
        self.tracing = try Self.tracingSettings(reader)
    }

    /// The admin token (credential `admin-token`, `METRICSD_ADMIN_TOKEN_FILE`, `METRICSD_ADMIN_TOKEN`), nil when
    /// none: refused when short, shaped like a JWT or the same as the JWT secret.
    private static func adminToken(environment: [String: String], tokens: TokenConfiguration)
        throws(ConfigurationError) -> String?
    {
        let adminToken = try Secrets.read(
            credential: "admin-token", file: "METRICSD_ADMIN_TOKEN_FILE", variable: "METRICSD_ADMIN_TOKEN",
            environment: environment)
        if let adminToken {
            guard adminToken.utf8.count >= 16 else {
                throw ConfigurationError(.adminTokenTooShort, "the admin token must be at least 16 characters long")
            }
            guard adminToken.split(separator: ".").count != 3 || !adminToken.hasPrefix("eyJ") else {
                throw ConfigurationError(
                    .adminTokenIsJWT,
                    "the admin token must not be a JWT: admin and user tokens are never interchangeable")
            }
            if let secret = tokens.hmacSecret, secret == adminToken {
                throw ConfigurationError(.adminTokenIsJWTSecret, "the admin token must differ from the JWT secret")
            }
        }
        return adminToken
    }

    /// How the daemon's read servers are run: pools of `METRICSD_READ_BATCHES` connections (as many batched reads
    /// run at once), the pool's wait and session age.
    public var readReplicasConfiguration: ReadReplicas.Configuration {
        ReadReplicas.Configuration(
            maxLag: self.database.readMaxLag, poolSize: self.readBatches,
            acquireTimeout: TimeAmount(self.acquireTimeout),
            maxSessionAge: self.sessionMaxAge)
    }

    /// The primary's pool: `METRICSD_DB_POOL_SIZE` connections, the wait for one, the age of a session.
    public var poolConfiguration: PostgresPool.Configuration {
        PostgresPool.Configuration(
            size: self.poolSize, acquireTimeout: TimeAmount(self.acquireTimeout), maxSessionAge: self.sessionMaxAge)
    }
}

/// Typed reads of environment variables with messages that name the variable.
struct EnvironmentReader {
    let environment: [String: String]
    init(_ environment: [String: String]) { self.environment = environment }

    /// The value, nil when unset or empty.
    subscript(name: String) -> String? {
        guard let value = self.environment[name], !value.isEmpty else { return nil }
        return value
    }

    func parse<T>(_ name: String, default value: T, expected: String, _ parse: (String) -> T?)
        throws(ConfigurationError) -> T
    {
        try self.parseOptional(name, expected: expected, parse) ?? value
    }

    /// A setting whose default is the catalogue's, read by the same parser as a value that is set.
    func parse<T>(_ name: String, expected: String, _ parse: (String) -> T?) throws(ConfigurationError) -> T {
        guard let text = SettingsCatalog.setting(name)?.defaultValue, let value = parse(text) else {
            preconditionFailure("\(name) has no default in SettingsCatalog that its parser takes")
        }
        return try self.parse(name, default: value, expected: expected, parse)
    }

    func parseOptional<T>(_ name: String, expected: String, _ parse: (String) -> T?) throws(ConfigurationError) -> T? {
        guard let text = self[name] else { return nil }
        guard let value = parse(text) else {
            throw ConfigurationError(.invalidValue, "\(name)=\(Self.shown(text)) is not valid: expected \(expected)")
        }
        return value
    }

    /// A whole-number setting with the catalog's default and range.
    func integer(_ name: String) throws(ConfigurationError) -> Int {
        guard let setting = SettingsCatalog.setting(name), case .integer(let range) = setting.kind,
            let value = setting.defaultValue.flatMap({ Int($0) })
        else { preconditionFailure("\(name) is not a whole-number setting with a default in SettingsCatalog") }
        return try self.integer(name, default: value, range: range)
    }

    /// A setting in seconds with the catalog's default and range, as a duration.
    func duration(_ name: String) throws(ConfigurationError) -> Duration {
        .milliseconds(Int64((try self.number(name) * 1000).rounded()))
    }

    /// A number setting with the catalog's default and range.
    func number(_ name: String) throws(ConfigurationError) -> Double {
        guard let setting = SettingsCatalog.setting(name), case .number(let range) = setting.kind,
            let value = setting.defaultValue.flatMap({ Double($0) })
        else { preconditionFailure("\(name) is not a number setting with a default in SettingsCatalog") }
        return try self.number(name, default: value, range: range)
    }

    func integer(_ name: String, default value: Int, range: ClosedRange<Int>) throws(ConfigurationError) -> Int {
        try self.parse(name, default: value, expected: "an integer in \(range.lowerBound)...\(range.upperBound)") {
            Int($0).flatMap { range.contains($0) ? $0 : nil }
        }
    }

    func number(_ name: String, default value: Double, range: ClosedRange<Double>) throws(ConfigurationError) -> Double
    {
        try self.parse(name, default: value, expected: "a number in \(range.lowerBound)...\(range.upperBound)") {
            Double($0).flatMap { $0.isFinite && range.contains($0) ? $0 : nil }
        }
    }

    /// A value as shown in an error: secrets masked (``SecretPatterns``: a URL's password, `password=…`), then
    /// quoted and cut at 60 characters (masked first, so a cut never keeps the start of a password).
    static func shown(_ text: String) -> String {
        let masked = SecretPatterns.apply(text)
        return "'" + (masked.count > 60 ? String(masked.prefix(60)) + "…" : masked) + "'"
    }
}

extension Duration {
    /// In seconds, fractions included (for the driver's deadlines and log lines, which count in seconds).
    package var seconds: Double { Double(self.components.seconds) + Double(self.components.attoseconds) / 1e18 }
}
