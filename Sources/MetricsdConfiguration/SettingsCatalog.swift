import HealthMetrics
import MetricsdHTTP
import MetricsdTracing

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One setting (an environment variable): the single table from which `Configuration` takes ranges and
/// defaults, `metricsd help` lists the environment, `metricsd check-config` checks values, and the man page and
/// `systemd/metricsd.env.example` are generated (a test keeps both files in agreement with this table).
public struct Setting: Sendable {
    public enum Kind: Sendable {
        case integer(ClosedRange<Int>)
        case number(ClosedRange<Double>)
        case address
        /// `host:port`, or `unix:PATH`.
        case listener
        /// Addresses and networks (`10.0.0.0/8`).
        case networks
        case dailyTime
        case choice([String])
        case conninfo
        /// A path to a readable file.
        case file
        /// A path whose contents are a settings file.
        case settingsFile
        /// A directory.
        case directory
        /// A secret value itself (development only).
        case secret
        case text
    }

    public enum Group: String, Sendable, CaseIterable {
        case database = "Database"
        case http = "HTTP"
        case schedule = "Scheduling and work"
        case logging = "Logging"
        case tokens = "End-user tokens"
        case admin = "Admin"
        case tracing = "Tracing (OpenTelemetry)"
        case files = "Files"
        case testing = "Testing only (never set in production)"
    }

    public let name: String
    public let group: Group
    public let kind: Kind
    /// The default as a value (`8`, `127.0.0.1:8080`); nil when unset by default.
    public let defaultValue: String?
    /// What an unset setting means, when there is no plain default value (`libpq's defaults`).
    public let unsetMeaning: String?
    public let meaning: String
    /// True when `systemctl reload` (SIGHUP) applies a change made in `METRICSD_CONFIG_FILE`.
    public let reloadable: Bool

    init(
        _ name: String, _ group: Group, _ kind: Kind, default defaultValue: String? = nil, unset: String? = nil,
        reloadable: Bool = false, _ meaning: String
    ) {
        self.name = name
        self.group = group
        self.kind = kind
        self.defaultValue = defaultValue
        self.unsetMeaning = unset
        self.meaning = meaning
        self.reloadable = reloadable
    }

    /// The default as shown in help: the value, else what unset means.
    public var defaultText: String { self.defaultValue ?? self.unsetMeaning ?? "unset" }

    /// The accepted values, in words.
    public var rangeText: String {
        switch self.kind {
        case .integer(let range): "whole number \(range.lowerBound)-\(range.upperBound)"
        case .number(let range): "number \(Self.format(range.lowerBound))-\(Self.format(range.upperBound))"
        case .address: "host:port ([v6]:port; port 0 picks a free port)"
        case .listener: "host:port or unix:/absolute/path"
        case .networks: "addresses or networks, comma-separated (127.0.0.1,10.0.0.0/8,::1)"
        case .dailyTime: "HH:MM, 00:00-23:59"
        case .choice(let values): values.joined(separator: " | ")
        case .conninfo: "libpq URI or key=value connection string"
        case .file: "path of a readable file"
        case .settingsFile: "path of a NAME=value file; a leading - makes it optional"
        case .directory: "directory"
        case .secret: "text"
        case .text: "text"
        }
    }

    package static func format(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(value)
    }

    /// What is wrong with `value` for this setting, or nil when it is acceptable on its own (a few constraints
    /// between settings are checked by `Configuration`).
    public func problem(_ value: String) -> ConfigurationError? {
        func invalid(_ text: String) -> ConfigurationError { ConfigurationError(.invalidValue, text) }
        switch self.kind {
        case .integer(let range):
            guard let number = Int(value), range.contains(number) else {
                return invalid(
                    "must be a whole number from \(range.lowerBound) to \(range.upperBound), got \(EnvironmentReader.shown(value))"
                )
            }
        case .number(let range):
            guard let number = Double(value), number.isFinite, range.contains(number) else {
                return invalid(
                    "must be a number from \(Self.format(range.lowerBound)) to \(Self.format(range.upperBound)), got \(EnvironmentReader.shown(value))"
                )
            }
        case .address:
            guard let address = ListenAddress(parsing: value), address.unixPath == nil else {
                return invalid(
                    "must be host:port (e.g. 127.0.0.1:8080, [::1]:8080), got \(EnvironmentReader.shown(value))")
            }
        case .listener:
            guard ListenAddress(parsing: value) != nil else {
                return invalid(
                    "must be host:port or unix:/absolute/path (e.g. 127.0.0.1:9464, unix:/run/metricsd/internal.sock), got \(EnvironmentReader.shown(value))"
                )
            }
        case .networks:
            guard TrustedProxies(parsing: value) != nil else {
                return invalid(
                    "must be addresses or networks separated by commas (e.g. 127.0.0.1,::1,10.0.0.0/8), got \(EnvironmentReader.shown(value))"
                )
            }
        case .dailyTime:
            guard DailyTime(parsing: value) != nil else {
                return invalid("must be HH:MM (e.g. 00:05), got \(EnvironmentReader.shown(value))")
            }
        case .choice(let values):
            guard values.contains(value.lowercased()) else {
                return invalid(
                    "must be one of \(values.joined(separator: ", ")), got \(EnvironmentReader.shown(value))")
            }
        case .file:
            do {
                _ = try Secrets.readFile(value, what: "file")
            } catch {
                return ConfigurationError(
                    error.kind, error.message.hasPrefix("file: ") ? String(error.message.dropFirst(6)) : error.message)
            }
        case .conninfo, .settingsFile, .directory, .secret, .text:
            break
        }
        return nil
    }
}

/// Every setting metricsd reads.
public enum SettingsCatalog {
    public static let all: [Setting] = [
        Setting(
            "DATABASE_URL", .database, .conninfo, unset: "libpq's defaults",
            "PostgreSQL connection, e.g. postgresql:///metricsd?host=/var/run/postgresql (peer authentication over the local socket). Unset or empty: libpq's defaults and PG* variables (PGHOST, PGDATABASE, PGUSER...), i.e. the local socket and a database named after the user. A primary with standbys: list every server, postgresql://metricsd@db1:5432,db2:5432/metricsd?target_session_attrs=read-write&connect_timeout=5, and libpq picks the one that takes writes."
        ),
        Setting(
            "METRICSD_DB_PASSWORD_FILE", .database, .file, unset: "no password file",
            "File holding the database password. Under systemd the db-password credential is used instead; by hand, /etc/credstore/metricsd-db-password when readable."
        ),
        Setting(
            "METRICSD_READ_DATABASE_URL", .database, .conninfo, unset: "every read on DATABASE_URL",
            "Streaming standbys for the latest-metrics read (GET /v1/profile/metrics/today), as a libpq URL or key=value string; several hosts are allowed: postgresql://metricsd@db2:5432,db3:5432/metricsd?connect_timeout=2. metricsd reaches each host on its own (libpq 15 has no load_balance_hosts) and sends each read to the least busy one within METRICSD_READ_MAX_LAG_SECONDS of the primary, else to the primary. A server is read from only while it follows DATABASE_URL's primary (same system identifier and timeline; one that is not in recovery only when it is that primary itself), checked at every probe; with target_session_attrs=standby or prefer-standby only while it is a standby. Writes, acknowledgements, computation on request and /readyz stay on DATABASE_URL. The db-password credential applies to it too."
        ),
        Setting(
            "METRICSD_READ_MAX_LAG_SECONDS", .database, .number(1...3600), default: "5",
            "A read server whose data is further behind the primary than this many seconds (from its WAL replay position) is not read from until it catches up: a read shows every change committed on the primary more than this long ago. Between 1 and 5 s, it is also how long a read server may take to answer a read (connecting included) before it is left and the read answered by the primary."
        ),
        Setting(
            "METRICSD_DB_POOL_SIZE", .database, .integer(1...200), default: "8", "Database connections in the pool."),
        Setting(
            "METRICSD_READ_BATCHES", .database, .integer(1...200), default: "2",
            "Batched latest-metrics reads running at once (at most METRICSD_DB_POOL_SIZE; the default is 2 or the pool size if smaller)."
        ),
        Setting(
            "METRICSD_DB_ACQUIRE_TIMEOUT_MS", .database, .integer(10...60_000), default: "2000",
            "How long a request waits for a free connection before answering 503, in milliseconds."),
        Setting(
            "METRICSD_DB_STATEMENT_DEADLINE_SECONDS", .database, .number(1...3600), default: "30",
            "Seconds one database statement (a COMMIT included) may take before metricsd cancels it and drops the connection, so nothing waits forever on a server that stopped answering (a promoted standby still waiting for a synchronous standby, a vanished host). Migrations have no deadline."
        ),
        Setting(
            "METRICSD_DB_PREPARED_STATEMENTS", .database, .choice(["auto", "named", "unnamed"]), default: "auto",
            "Named prepared statements (prepared once per session: the cheapest) or unnamed ones (parsed and planned with every statement, in one message sequence a pooler keeps on one server). auto: named on a direct connection (or through HAProxy), unnamed when a connection pooler answers instead of PostgreSQL (PgBouncer: its cancel key differs from pg_backend_pid()). Set named behind PgBouncer in session mode, or PgBouncer 1.21 and later with max_prepared_statements above 0; unnamed is always safe."
        ),
        Setting(
            "METRICSD_NOTIFY_DATABASE_URL", .database, .conninfo, unset: "DATABASE_URL, when it is not a pooler",
            "Where the daemon LISTENs for settings changes and work, and recompute-all --wait for its job: PostgreSQL's primary itself (or HAProxy's primary port, or a PgBouncer pool in session mode), when DATABASE_URL goes through a transaction-mode pooler, which delivers notifications to the wrong client or drops them. Migrations that run outside a transaction run there too (they need one server session throughout). Unset and DATABASE_URL pooled, or set and a notification the daemon sends itself does not arrive within 2 s: no LISTEN at all, settings changes are picked up by polling every METRICSD_IDLE_POLL_SECONDS, and it says so (a start-up warning, /readyz detail, metricsd_notifications_usable 0, metricsd status)."
        ),
        Setting(
            "METRICSD_DB_SESSION_MAX_AGE", .database, .number(1...86_400), default: "600",
            "Seconds a database session is used before a new one replaces it. Sessions keep a time zone's rules once loaded, so after a tzdata update on the database server the daemon follows the new rules within this time (plus one scheduler tick)."
        ),

        Setting(
            "METRICSD_LISTEN", .http, .address, default: "127.0.0.1:8080",
            "The public HTTP listener: the user API and the health checks (and /metrics and the admin API while there is no internal listener). Under socket activation (metricsd.socket) the socket unit's ListenStream= is used instead."
        ),
        Setting(
            "METRICSD_INTERNAL_LISTEN", .http, .listener, unset: "everything on METRICSD_LISTEN",
            "The internal listener, a loopback address or a Unix socket: /metrics, the admin API and the health checks; the public listener then answers 404 for /metrics and /v1/admin/*. Recommended. Under socket activation a socket with FileDescriptorName=internal (metricsd-internal.socket) is used instead."
        ),
        Setting(
            "METRICSD_METRICS_LISTEN", .http, .listener, unset: "none",
            "The former name of METRICSD_INTERNAL_LISTEN (which also serves the admin API); set only one of them."),
        Setting(
            "METRICSD_TLS", .http, .choice(["off", "public", "internal", "both"]), default: "off",
            "Which listeners speak TLS (1.2 and 1.3 only, forward-secret AEAD ciphers), with the certificate and key from the credentials tls-certificate and tls-key (/etc/credstore/metricsd-tls-certificate and metricsd-tls-key; enable their LoadCredential= lines). systemctl reload picks up a renewed certificate without dropping a connection. An expired certificate, or one whose key is RSA under 2048 bits or EC on a curve other than P-256, P-384 or P-521, is refused (at start, on reload, by check-config); one expiring within 14 days is warned about."
        ),
        Setting(
            "METRICSD_TLS_CERTIFICATE_FILE", .http, .file, unset: "the tls-certificate credential", reloadable: true,
            "PEM certificate (then its intermediates) for METRICSD_TLS. Under systemd the tls-certificate credential is used instead; by hand, /etc/credstore/metricsd-tls-certificate when readable."
        ),
        Setting(
            "METRICSD_TLS_KEY_FILE", .http, .file, unset: "the tls-key credential", reloadable: true,
            "PEM private key of the TLS certificate. Under systemd the tls-key credential is used instead; by hand, /etc/credstore/metricsd-tls-key when readable."
        ),
        Setting(
            "METRICSD_TRUSTED_PROXIES", .http, .networks, unset: "none: the peer's address",
            "Reverse proxies whose forwarded-address header (METRICSD_FORWARDED_HEADER) names the client in the request log (HTTP_CLIENT), read from the right up to the first address that is not a trusted proxy. From any other peer the header is ignored. A range that holds much of the internet (wider than /8 for IPv4 or /16 for IPv6, holding public addresses) is accepted with a warning at start and in check-config: any client in it could choose the address logged."
        ),
        Setting(
            "METRICSD_FORWARDED_HEADER", .http, .choice(["x-forwarded-for", "forwarded"]), default: "x-forwarded-for",
            "The one header that names the client behind a trusted proxy; the other is ignored, from every peer. x-forwarded-for is what the nginx example sets (it also clears Forwarded, which a client could send itself); forwarded reads the for= of RFC 7239's Forwarded, for a proxy that sets that one (and clears X-Forwarded-For)."
        ),
        Setting(
            "METRICSD_HTTP_REQUEST_TIMEOUT_SECONDS", .http, .number(0.1...600), default: "10",
            "A request's head and body must each arrive within this many seconds."),
        Setting(
            "METRICSD_HTTP_IDLE_TIMEOUT_SECONDS", .http, .number(0.1...3600), default: "60",
            "An idle keep-alive connection is closed after this many seconds."),
        Setting(
            "METRICSD_HTTP_WRITE_TIMEOUT_SECONDS", .http, .number(0.1...600), default: "10",
            "A reply the client does not take within this many seconds (it stopped reading) closes the connection; closing replies included."
        ),
        Setting(
            "METRICSD_MAX_CONNECTIONS", .http, .integer(1...100_000), default: "1024",
            "Open HTTP connections accepted at once on the public listener; beyond it a connection is answered 503 and closed (logged at most every 10 s)."
        ),
        Setting(
            "METRICSD_INTERNAL_MAX_CONNECTIONS", .http, .integer(1...100_000), default: "64",
            "Open connections accepted at once on the internal listener (Prometheus, the operator's tools), counted apart from the public ones and in the open-file budget beside METRICSD_MAX_CONNECTIONS; beyond it a connection is answered 503 and closed (logged at most every 10 s)."
        ),
        Setting(
            "METRICSD_MAX_IN_FLIGHT", .http, .integer(1...100_000), default: "64",
            "Requests handled at once; beyond it a request gets an immediate 503 with Retry-After. Default 8 x METRICSD_DB_POOL_SIZE, at most METRICSD_MAX_CONNECTIONS."
        ),
        Setting(
            "METRICSD_SHUTDOWN_SECONDS", .http, .number(0.1...600), default: "20",
            "How long SIGTERM waits for requests and the current batch (below the unit's TimeoutStopSec=30s)."),

        Setting(
            "METRICSD_DAILY_AT", .schedule, .dailyTime, default: "00:05", reloadable: true,
            "Local time of the daily run in each user's time zone."),
        Setting(
            "METRICSD_WORKERS", .schedule, .integer(0...64), default: "2",
            "Chunks of users this instance computes at once (0: serve only)."),
        Setting("METRICSD_BATCH_SIZE", .schedule, .integer(1...50_000), default: "1000", "Users per transaction."),
        Setting(
            "METRICSD_CHUNK_SIZE", .schedule, .integer(1...10_000_000), default: "5000",
            "Users per claimed chunk of work."),
        Setting(
            "METRICSD_LEASE_SECONDS", .schedule, .number(1...3600), default: "60",
            "A claimed chunk not renewed within this many seconds is taken over by another instance."),
        Setting(
            "METRICSD_TICK_SECONDS", .schedule, .number(0.05...3600), default: "60",
            "How often the scheduler asks which time zones are due (aligned to the minute)."),
        Setting(
            "METRICSD_IDLE_POLL_SECONDS", .schedule, .number(0.05...600), default: "2",
            "How often idle workers look for work queued by other instances."),
        Setting(
            "METRICSD_RETENTION_DAYS", .schedule, .integer(0...36_500), default: "0",
            "Remove metrics rows computed more than this many days ago, in the background, shared by the instances that set it (0: keep everything). Each user keeps their newest row of each formula version, and a row goes only once a newer one is over 3 days old."
        ),
        Setting(
            "METRICSD_HISTORY_MOVE", .schedule, .choice(["on", "off"]), default: "on",
            "Move the history an upgrade left in the old partition of profile_metrics into monthly partitions, in the background, shared by the instances that set it (it needs free disk space about the old partition's size until it ends; metricsd status shows how far it is). off: this instance leaves it for now, e.g. until a quiet hour."
        ),

        Setting(
            "METRICSD_LOG_LEVEL", .logging,
            .choice(["trace", "debug", "info", "notice", "warning", "error", "critical"]),
            default: "info", reloadable: true, "Lowest level logged."),
        Setting(
            "METRICSD_LOG_FORMAT", .logging, .choice(["text", "json", "journal"]),
            unset: "journal when stderr is the journal, else text", "Log format."),
        Setting(
            "METRICSD_REQUEST_LOG", .logging, .choice(["off", "errors", "all"]), default: "errors", reloadable: true,
            "Which requests get a request log line."),

        Setting(
            "METRICSD_JWT_SECRET_FILE", .tokens, .file, unset: "the jwt-secret credential", reloadable: true,
            "File holding the HS256 secret for end-user tokens (at least 32 bytes). Under systemd the jwt-secret credential is used instead; by hand, /etc/credstore/metricsd-jwt-secret when readable."
        ),
        Setting(
            "METRICSD_JWT_SECRET", .tokens, .secret, unset: "none", reloadable: true,
            "The HS256 secret itself (development only: visible in the process environment; use the credential)."),
        Setting(
            "METRICSD_JWT_PUBLIC_KEY_FILE", .tokens, .file, unset: "none", reloadable: true,
            "PEM public key (RS256/ES256/EdDSA) for end-user tokens, instead of or besides the secret. Besides it, HS256 tokens stay accepted and whoever reads the secret can mint tokens: to verify without being able to mint, configure no secret or set METRICSD_JWT_HS256=off."
        ),
        Setting(
            "METRICSD_JWT_HS256", .tokens, .choice(["on", "off"]), default: "on", reloadable: true,
            "Accept HS256 tokens signed with the JWT secret. off: the secret is not read and only the public key's algorithm is accepted (METRICSD_JWT_PUBLIC_KEY_FILE is then required)."
        ),
        Setting("METRICSD_JWT_ISSUER", .tokens, .text, unset: "not checked", reloadable: true, "Required iss claim."),
        Setting("METRICSD_JWT_AUDIENCE", .tokens, .text, unset: "not checked", reloadable: true, "Required aud claim."),
        Setting(
            "METRICSD_JWT_LEEWAY_SECONDS", .tokens, .integer(0...300), default: "30", reloadable: true,
            "Clock skew allowed for exp and nbf, in seconds."),

        Setting(
            "METRICSD_ADMIN_TOKEN_FILE", .admin, .file, unset: "the admin-token credential", reloadable: true,
            "File holding the admin bearer token (at least 16 characters, not a JWT, not the JWT secret). Under systemd the admin-token credential is used instead; by hand, /etc/credstore/metricsd-admin-token when readable. Without any admin token there are no admin endpoints."
        ),
        Setting(
            "METRICSD_ADMIN_TOKEN", .admin, .secret, unset: "none", reloadable: true,
            "The admin token itself (development only: visible in the process environment; use the credential)."),

        Setting(
            "OTEL_TRACES_EXPORTER", .tracing, .choice(["otlp", "none"]), default: "none",
            "otlp sends traces to an OpenTelemetry collector's OTLP/HTTP receiver as JSON: a span for each HTTP request (continuing a traceparent only from METRICSD_TRUSTED_PROXIES), its wait for a database connection or a read batch, each PostgreSQL statement (a sampled one serving one request or chunk carries its traceparent as a comment in its text, seen in pg_stat_activity and the server's log; the batched latest read never does), and each daily-unit and recompute-all chunk. Spans never carry parameter values. none (the default) makes no spans at all."
        ),
        Setting(
            "OTEL_EXPORTER_OTLP_ENDPOINT", .tracing, .text, default: "http://localhost:4318",
            "The collector's OTLP/HTTP base URL; traces go to its path /v1/traces. http:// or https:// (TLS 1.2 or later; the collector's certificate is verified against the system's trust roots, or OTEL_EXPORTER_OTLP_CERTIFICATE, and must name the URL's host)."
        ),
        Setting(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", .tracing, .text, unset: "the endpoint's /v1/traces",
            "The full URL traces are sent to, used as it is (instead of OTEL_EXPORTER_OTLP_ENDPOINT)."),
        Setting(
            "OTEL_EXPORTER_OTLP_CERTIFICATE", .tracing, .file, unset: "the system's trust roots",
            "PEM file of the certificate authorities an https:// endpoint's certificate must chain to (a private CA), instead of the system's. Read at start: a file that cannot be read or holds no certificate is refused, as is one set for an http:// endpoint."
        ),
        Setting(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", .tracing, .file, unset: "the general one",
            "The same for traces alone: wins over OTEL_EXPORTER_OTLP_CERTIFICATE, the general one."),
        Setting(
            "OTEL_EXPORTER_OTLP_PROTOCOL", .tracing, .choice(["http/json"]), default: "http/json",
            "Only http/json is supported (grpc and http/protobuf are refused at start and by check-config)."
        ),
        Setting(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", .tracing, .choice(["http/json"]),
            unset: "OTEL_EXPORTER_OTLP_PROTOCOL",
            "The same for traces alone: only http/json."),
        Setting(
            "OTEL_TRACES_SAMPLER", .tracing, .choice(Sampler.names), default: "parentbased_always_on",
            "Which traces are recorded: always_on, always_off, traceidratio (OTEL_TRACES_SAMPLER_ARG of them, by trace id), or parentbased_* (a request continuing a trusted proxy's traceparent follows its sampled flag; traces starting here as the rest of the name says). A trace that is not recorded costs its requests nothing but a few ids."
        ),
        Setting(
            "OTEL_TRACES_SAMPLER_ARG", .tracing, .number(0...1), default: "1",
            "The ratio of the traceidratio samplers, 0 to 1 (0.01: one trace in a hundred)."),
        Setting(
            "OTEL_SERVICE_NAME", .tracing, .text, default: "metricsd",
            "service.name of the spans (tell instances apart by the host in the collector, or set it per instance)."),

        Setting(
            "METRICSD_CONFIG_FILE", .files, .settingsFile, default: "-/etc/metricsd/metricsd.conf",
            "NAME=value file re-read on SIGHUP (systemctl reload): the reloadable settings go there."),
        Setting(
            "METRICSD_ENV_FILE", .files, .settingsFile, default: "/etc/metricsd/metricsd.env",
            "The settings file read when metricsd runs outside systemd (the unit's EnvironmentFile=). Exported variables win over it."
        ),
        Setting(
            "METRICSD_CREDSTORE", .files, .directory, default: "/etc/credstore",
            "Where metricsd run outside systemd finds the credentials metricsd-jwt-secret, metricsd-admin-token and metricsd-db-password."
        ),

        Setting(
            "METRICSD_TEST_FORMULA_VERSION", .testing, .text, unset: "this build's formula version",
            "Label the formulas with this (higher) version, to rehearse a formula upgrade."),
    ]

    /// Variables set by systemd that metricsd reads (documented, never set by hand).
    public static let systemdVariables: [(name: String, meaning: String)] = [
        (
            "INVOCATION_ID",
            "set by systemd: metricsd uses the environment as the unit gives it and reads no settings file itself"
        ),
        ("CREDENTIALS_DIRECTORY", "the unit's credentials: jwt-secret, admin-token, db-password"),
        ("NOTIFY_SOCKET", "sd_notify: READY, STATUS, RELOADING, STOPPING, WATCHDOG"),
        ("WATCHDOG_USEC, WATCHDOG_PID", "the watchdog interval (WatchdogSec=)"),
        ("JOURNAL_STREAM", "stderr is the journal: log in journal format"),
    ]

    public static func setting(_ name: String) -> Setting? { self.all.first { $0.name == name } }

    /// The default of a whole-number setting (what an unset setting reads as).
    public static func integerDefault(_ name: String) -> Int {
        guard let value = self.setting(name)?.defaultValue.flatMap({ Int($0) }) else {
            preconditionFailure("\(name) is not a whole-number setting with a default in SettingsCatalog")
        }
        return value
    }

    /// `METRICSD_LISTEN`'s default, where the daemon is reached when that setting is not set (the health check,
    /// `check-config`, the operator's commands).
    public static var defaultListen: String {
        guard let value = self.setting("METRICSD_LISTEN")?.defaultValue else {
            preconditionFailure("METRICSD_LISTEN has no default in SettingsCatalog")
        }
        return value
    }

    /// `METRICSD_*` variables of metricsd's own scripts and tests, which are no settings (the test database,
    /// PostgreSQL's binaries, the built binary, the fault-injecting test build's faults): prefixes, and whole names.
    /// Never reported as unknown settings.
    public static let toolingPrefixes = [
        "METRICSD_TEST_", "METRICSD_PG_", "METRICSD_BINARY", "METRICSD_CONTRACT_", "METRICSD_PACKAGE_",
    ]
    public static let toolingNames: Set<String> = ["METRICSD_FAULTS", "METRICSD_LONG_TESTS"]

    /// Whether `name` belongs to metricsd's scripts and tests rather than to its settings.
    public static func isTooling(_ name: String) -> Bool {
        self.toolingNames.contains(name) || self.toolingPrefixes.contains { name.hasPrefix($0) }
    }

    /// Settings named in `systemd/metricsd.env.example`: all but the testing ones and those whose value is a secret
    /// (the file is world-readable; secrets are credentials).
    public static var operatorSettings: [Setting] {
        self.all.filter {
            guard $0.group != .testing else { return false }
            if case .secret = $0.kind { return false }
            return true
        }
    }

    /// Settings whose value is a secret itself (development only; `check-config` warns when they are set).
    public static var secretSettings: [Setting] {
        self.all.filter {
            if case .secret = $0.kind { return true }
            return false
        }
    }
}
