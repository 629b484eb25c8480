import Glibc
import MetricsdHTTP

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The file descriptors `metricsd serve` may hold at once, against its open-file limit (`RLIMIT_NOFILE`).
///
/// Every accepted HTTP connection, every database session and every listener is a descriptor. systemd 252 starts
/// a service with a soft limit of 1,024 (hard 524,288), below `METRICSD_MAX_CONNECTIONS`' default of 1,024 plus the
/// pool: without a budget, `accept()` and new database sessions would fail with `EMFILE` (silently: the kernel
/// keeps the connections in the listen backlog) before the daemon's own connection limits applied. So `serve`
/// raises its soft limit to the hard limit at start (``raiseSoftLimit()``) and refuses a configuration whose
/// budget does not fit (one line naming `METRICSD_MAX_CONNECTIONS`); `check-config` reports the same.
public struct DescriptorBudget: Sendable, Equatable {
    /// One use of descriptors.
    public struct Item: Sendable, Equatable {
        public let what: String
        public let count: Int
    }

    public private(set) var items: [Item] = []

    /// What the process holds besides connections and listeners: standard streams, the journal and notify
    /// sockets, signal descriptors, each event loop's epoll, eventfd and timerfd, a session being replaced while
    /// its successor connects, name lookups. 23 descriptors in all at idle on 2 cores (`ls /proc/PID/fd`, pool
    /// and listener included); the reserve is 64 + 4 per core.
    public static func reserve(cores: Int = ProcessInfo.processInfo.activeProcessorCount) -> Int {
        64 + 4 * max(1, cores)
    }

    /// The budget of a daemon with `configuration` and `readServers` hosts in `METRICSD_READ_DATABASE_URL`.
    /// - Parameters:
    ///   - sockets: the listening sockets systemd passes, when it passes any: they replace `METRICSD_LISTEN` and
    ///     `METRICSD_INTERNAL_LISTEN` (a dual-stack unit passes two for one listener).
    public init(configuration: Configuration, readServers: Int = 0, sockets: (public: Int, internal: Int) = (0, 0)) {
        let publicSockets = sockets.public > 0 ? sockets.public : 1
        let internalSockets = sockets.internal > 0 ? sockets.internal : (configuration.internalListen == nil ? 0 : 1)
        self.add("HTTP connections (METRICSD_MAX_CONNECTIONS)", configuration.maxConnections)
        if internalSockets > 0 {
            self.add(
                "internal listener's connections (METRICSD_INTERNAL_MAX_CONNECTIONS)",
                configuration.internalMaxConnections)
        }
        // A refused connection lingers until its client closes (at most a second), a few at a time per listener.
        self.add("refused connections finishing", ConnectionLimit.lingeringRefusals * (internalSockets > 0 ? 2 : 1))
        self.add("database pool (METRICSD_DB_POOL_SIZE)", configuration.poolSize)
        self.add("settings listener session", 1)
        if readServers > 0 {
            // Per read server: a pool of METRICSD_READ_BATCHES and the monitor's session; and its session on the primary.
            self.add(
                "read servers' sessions (METRICSD_READ_DATABASE_URL)", readServers * (configuration.readBatches + 1) + 1
            )
        }
        let listening = publicSockets + internalSockets
        self.add(listening == 1 ? "listening socket" : "listening sockets", listening)
        self.add("reserve", Self.reserve())
    }

    /// Adds a use (a further pool: `add("read pool", size)`).
    public mutating func add(_ what: String, _ count: Int) { self.items.append(Item(what: what, count: count)) }

    /// Descriptors needed at most.
    public var total: Int { self.items.reduce(0) { $0 + $1.count } }

    /// The most HTTP connections that fit `limit` with everything else unchanged.
    public func maxConnectionsFitting(_ limit: Int) -> Int {
        let others = self.total - (self.items.first?.count ?? 0)
        return max(0, limit - others)
    }

    /// The one-line error when the budget does not fit `limit` (a soft limit), else nil.
    public func problem(limit: Int) -> String? {
        guard self.total > limit else { return nil }
        let parts = self.items.map { "\($0.count) \($0.what)" }.joined(separator: " + ")
        let fitting = self.maxConnectionsFitting(limit)
        let advice =
            fitting > 0
            ? "lower METRICSD_MAX_CONNECTIONS to \(fitting) or less, or raise the hard limit (LimitNOFILE= in the unit)"
            : "raise the hard limit (LimitNOFILE= in the unit)"
        return
            "METRICSD_MAX_CONNECTIONS=\(self.items.first?.count ?? 0) needs \(self.total) file descriptors (\(parts)), but the open-file limit (RLIMIT_NOFILE) is \(limit): \(advice)"
    }

    /// The summary line of `check-config`.
    public func summary(limit: Int) -> String {
        "\(self.total) needed of \(limit) (RLIMIT_NOFILE hard limit; serve raises its soft limit to it)"
    }

    // MARK: - The limit

    /// The process's open-file limit now.
    public static func limit() -> (soft: Int, hard: Int) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (1024, 1024) }
        return (Self.clamp(limit.rlim_cur), Self.clamp(limit.rlim_max))
    }

    /// Raises the soft limit to the hard limit (`rlim_t.max` is RLIM_INFINITY; capped at the kernel's `fs.nr_open` when the hard limit is
    /// unlimited) and returns the limits then in force. The daemon starts no other program, so nothing inherits
    /// the raised limit (programs that still use `select()` need descriptors below 1,024).
    @discardableResult
    public static func raiseSoftLimit() -> (soft: Int, hard: Int) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return Self.limit() }
        var target = limit.rlim_max
        if target == rlim_t.max { target = rlim_t(Self.kernelMaximum()) }
        if limit.rlim_cur != rlim_t.max && limit.rlim_cur < target {
            limit.rlim_cur = target
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return Self.limit()
    }

    private static func clamp(_ value: rlim_t) -> Int {
        value == rlim_t.max || value > rlim_t(Int.max) ? Self.kernelMaximum() : Int(value)
    }

    /// `/proc/sys/fs/nr_open`, the most descriptors a process may have (1,048,576 by default).
    private static func kernelMaximum() -> Int {
        (try? String(contentsOfFile: "/proc/sys/fs/nr_open", encoding: .utf8))
            .flatMap { Int($0.trimmingWhitespace()) } ?? 1_048_576
    }
}
