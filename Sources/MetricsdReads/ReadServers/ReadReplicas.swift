import MetricsdPostgres
import MetricsdWork
import CoreMetrics
import HealthMetrics
import Logging
import NIOCore
import NIOPosix
import Synchronization

/// The latest-metrics read spread over streaming standbys (`METRICSD_READ_DATABASE_URL`), never staler than
/// `maxLag`, with the primary behind them.
///
/// Each read server has its own small pool. A read goes to the least busy server that is *usable* — its last
/// probe answered and its data is at most `maxLag` behind the primary (``WALHistory``: replay position against
/// the primary's recent WAL positions, rechecked against the clock at every read, so a server that stops replaying
/// is left when the bound runs out even between probes) — taking turns among equals. With none usable the read goes
/// to the primary. Users a standby has no row for are read again on the primary before the caller computes them
/// on request: a user just computed by another instance is not computed twice. A read that fails on a standby
/// (down, refused, cut) marks it down at once and is answered by the primary instead; the monitor (``run()``)
/// probes every server and the primary's WAL position a few times per `maxLag` and takes a server back as soon as
/// it answers and has caught up.
///
/// Only the latest read comes here: every write, every acknowledgement, on-request computation and `/readyz` stay
/// on the primary's pool.
public final class ReadReplicas: Sendable {
    public struct Configuration: Sendable {
        /// A server whose data is further behind the primary than this is not read from.
        public var maxLag: Duration
        /// Connections per read server (at most as many batched reads run at once).
        public var poolSize: Int
        public var acquireTimeout: TimeAmount
        public var maxSessionAge: Duration?

        public init(maxLag: Duration, poolSize: Int, acquireTimeout: TimeAmount = .seconds(2), maxSessionAge: Duration? = nil) {
            self.maxLag = maxLag
            self.poolSize = poolSize
            self.acquireTimeout = acquireTimeout
            self.maxSessionAge = maxSessionAge
        }
    }

    /// One read server as the daemon sees it (`/metrics`, the heartbeat, `metricsd status`).
    public struct ServerStatus: Sendable, Equatable {
        /// `host:port`, or `primary` for the reads the primary answered.
        public let server: String
        /// Reads go there now.
        public let usable: Bool
        /// Seconds of the primary's commits it may lack; nil when not known (never reached).
        public let lagSeconds: Double?
        /// Users' latest reads it answered since this daemon started.
        public let reads: Int
        /// Why it is not usable, in a few words (nil when usable).
        public let problem: String?

        public init(server: String, usable: Bool, lagSeconds: Double?, reads: Int, problem: String?) {
            self.server = server
            self.usable = usable
            self.lagSeconds = lagSeconds
            self.reads = reads
            self.problem = problem
        }
    }

    final class Server: Sendable {
        struct State {
            /// The last probe (or read) reached it.
            var up = false
            /// Its data holds every commit the primary made before this instant.
            var freshAsOf: ContinuousClock.Instant?
            /// Why it is down, when it is.
            var failure: String?
            var replayPaused = false
            var inFlight = 0
            var reads = 0
            /// Whether it was usable when last logged (a line is logged when this changes).
            var announced: Bool?

            func staleness(at now: ContinuousClock.Instant) -> Duration? {
                self.freshAsOf.map { now - $0 }
            }

            func usable(at now: ContinuousClock.Instant, maxLag: Duration) -> Bool {
                guard self.up, let staleness = self.staleness(at: now) else { return false }
                return staleness <= maxLag
            }
        }

        let label: String
        let pool: PostgresPool
        let state = Mutex(State())
        let readsCounter: Counter
        let usableGauge: Gauge
        let lagGauge: Gauge

        init(label: String, pool: PostgresPool) {
            self.label = label
            self.pool = pool
            self.readsCounter = Counter(label: "metricsd_read_server_reads_total", dimensions: [("server", label)])
            self.usableGauge = Gauge(label: "metricsd_read_server_usable", dimensions: [("server", label)])
            self.lagGauge = Gauge(label: "metricsd_read_server_lag_seconds", dimensions: [("server", label)])
        }
    }

    let primary: PostgresPool
    let servers: [Server]
    let configuration: Configuration
    let logger: Logger
    /// The primary's recent WAL positions.
    let history: Mutex<WALHistory>
    /// Runs the monitor's blocking calls on the primary (never queued behind the primary pool's requests).
    let threads: NIOThreadPool
    private let turn = Atomic<Int>(0)
    private let primaryReads = Atomic<Int>(0)
    private let primaryReadsCounter = Counter(label: "metricsd_read_server_reads_total", dimensions: [("server", "primary")])
    private let missingCounter = Counter(label: "metricsd_read_fallbacks_total", dimensions: [("reason", "missing")])
    private let errorCounter = Counter(label: "metricsd_read_fallbacks_total", dimensions: [("reason", "error")])

    /// How often the primary's position and each server are probed: five times per bound, at most once a second.
    var probeInterval: Duration { min(.seconds(1), max(.milliseconds(100), self.configuration.maxLag / 5)) }
    public var probeIntervalSeconds: Double { Self.seconds(self.probeInterval) }
    /// How long a probe or a read may wait for a read server's answer before it counts as down (and the read goes
    /// to the primary): the bound, between 1 and 5 s.
    var readDeadlineSeconds: Double { Self.readDeadlineSeconds(maxLag: self.configuration.maxLag) }

    static func readDeadlineSeconds(maxLag: Duration) -> Double {
        min(5, max(1, Self.seconds(maxLag)))
    }

    /// - Parameters:
    ///   - servers: from ``ConnectionSettings/readServers()`` (each accepts read-only servers).
    ///   - statementDeadlineSeconds: the daemon's statement deadline; a read server's is at most ``readDeadlineSeconds``.
    public init(
        primary: PostgresPool, servers: [ConnectionSettings.ReadServer], configuration: Configuration,
        statementDeadlineSeconds: Double?, logger: Logger
    ) {
        self.primary = primary
        self.configuration = configuration
        self.logger = logger
        self.history = Mutex(WALHistory(horizon: configuration.maxLag * 2 + .seconds(2)))
        self.threads = NIOThreadPool(numberOfThreads: 1)
        let deadline = Self.readDeadlineSeconds(maxLag: configuration.maxLag)
        self.servers = servers.map { server in
            var settings = server.settings
            settings.statementDeadlineSeconds = min(statementDeadlineSeconds ?? deadline, deadline)
            let pool = PostgresPool(
                settings: settings,
                configuration: .init(
                    size: configuration.poolSize, acquireTimeout: configuration.acquireTimeout,
                    maxSessionAge: configuration.maxSessionAge, recordsMetrics: false),
                logger: logger)
            return Server(label: server.label, pool: pool)
        }
        self.threads.start()
        for server in self.servers {
            server.usableGauge.record(0)
            server.lagGauge.record(-1)
        }
    }

    /// The latest metrics of `userIDs` (those who have any): on a usable read server, the users it lacks and every
    /// user of a failed read on the primary.
    func read(userIDs: [Int64]) async throws -> [Int64: LatestMetrics] {
        var found: [Int64: LatestMetrics] = [:]
        var remaining = userIDs
        if let server = self.choose() {
            do {
                found = try await server.pool.withConnection(retryOnConnectionLoss: true) { connection in
                    try PostgresStore.readLatest(userIDs: userIDs, on: connection)
                }
                server.state.withLock {
                    $0.inFlight -= 1
                    $0.reads += found.count
                }
                server.readsCounter.increment(by: Int64(found.count))
                if found.count < userIDs.count {
                    remaining = userIDs.filter { found[$0] == nil }
                    self.missingCounter.increment(by: Int64(remaining.count))
                } else {
                    remaining = []
                }
            } catch {
                server.state.withLock { $0.inFlight -= 1 }
                self.errorCounter.increment(by: Int64(userIDs.count))
                self.readFailed(on: server, error)
            }
        }
        guard !remaining.isEmpty else { return found }
        let more = try await self.primary.withConnection(retryOnConnectionLoss: true) { [remaining] connection in
            try PostgresStore.readLatest(userIDs: remaining, on: connection)
        }
        self.primaryReads.add(remaining.count, ordering: .relaxed)
        self.primaryReadsCounter.increment(by: Int64(remaining.count))
        return found.merging(more) { $1 }
    }

    /// The least busy usable server (its read counted as in flight), taking turns among equals; nil: the primary.
    private func choose() -> Server? {
        let now = ContinuousClock.now
        let start = self.turn.add(1, ordering: .relaxed).newValue
        var best: (server: Server, load: Int)?
        for offset in 0..<self.servers.count {
            let server = self.servers[(start + offset) % self.servers.count]
            let load: Int? = server.state.withLock {
                $0.usable(at: now, maxLag: self.configuration.maxLag) ? $0.inFlight : nil
            }
            if let load, load < best?.load ?? .max { best = (server, load) }
        }
        best?.server.state.withLock { $0.inFlight += 1 }
        return best?.server
    }

    /// A read on `server` failed: a server that cannot be reached is down until a probe reaches it again.
    private func readFailed(on server: Server, _ error: any Error) {
        let summary = (error as? PostgresError)?.summary ?? "\(error)"
        let unreachable = (error as? PostgresError).map { $0.code == .connectionFailed || $0.code == .connectionLost } ?? false
        if unreachable {
            self.update(server) {
                $0.up = false
                $0.failure = summary
            }
        } else {
            self.logger.warning(
                "Latest read failed on a read server; answered by the primary",
                metadata: ["metricsd.read_server": "\(server.label)", "metricsd.error": "\(error)"])
        }
    }

    /// Changes what is known of `server`; records its gauges and logs when it becomes usable or stops being so.
    func update(_ server: Server, _ change: (inout Server.State) -> Void) {
        let now = ContinuousClock.now
        let maxLag = self.configuration.maxLag
        let (usable, announce, staleness, failure, paused) = server.state.withLock { state in
            change(&state)
            let usable = state.usable(at: now, maxLag: maxLag)
            let announce = state.announced != usable
            state.announced = usable
            return (usable, announce, state.staleness(at: now), state.failure, state.replayPaused)
        }
        server.usableGauge.record(usable ? 1 : 0)
        server.lagGauge.record(staleness.map(Self.seconds) ?? -1)
        guard announce else { return }
        var metadata: Logger.Metadata = ["metricsd.read_server": "\(server.label)"]
        if let staleness { metadata["metricsd.read_lag_s"] = "\(Self.rounded(Self.seconds(staleness)))" }
        if usable {
            self.logger.info("Reading from read server", metadata: metadata)
            return
        }
        metadata["metricsd.read_max_lag_s"] = "\(Self.rounded(Self.seconds(maxLag)))"
        metadata["metricsd.reason"] = "\(Self.reason(failure: failure, staleness: staleness, paused: paused, maxLag: maxLag))"
        self.logger.warning("Not reading from read server; reads go to the primary or another read server", metadata: metadata)
    }

    /// Why a server is not usable, in a few words.
    static func reason(failure: String?, staleness: Duration?, paused: Bool, maxLag: Duration) -> String {
        if let failure { return "unreachable: \(failure)" }
        guard let staleness else { return "replay position not known" }
        let behind = "\(Self.rounded(Self.seconds(staleness))) s behind the primary (bound \(Self.rounded(Self.seconds(maxLag))) s)"
        return paused ? "replay paused, \(behind)" : behind
    }

    /// Every read server, then the primary's share.
    public func status() -> [ServerStatus] {
        let now = ContinuousClock.now
        let maxLag = self.configuration.maxLag
        var all = self.servers.map { server in
            server.state.withLock { state in
                let usable = state.usable(at: now, maxLag: maxLag)
                let staleness = state.staleness(at: now)
                return ServerStatus(
                    server: server.label, usable: usable, lagSeconds: staleness.map(Self.seconds), reads: state.reads,
                    problem: usable ? nil : Self.reason(failure: state.failure, staleness: staleness, paused: state.replayPaused, maxLag: maxLag))
            }
        }
        all.append(
            ServerStatus(server: "primary", usable: true, lagSeconds: 0, reads: self.primaryReads.load(ordering: .relaxed), problem: nil))
        return all
    }

    /// Closes every read server's pool and the monitor's threads.
    public func close() async {
        for server in self.servers { await server.pool.close() }
        try? await self.threads.shutdownGracefully()
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// Two decimals.
    static func rounded(_ value: Double) -> Double { (value * 100).rounded() / 100 }
}
