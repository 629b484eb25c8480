import CoreMetrics
import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdWork
import NIOCore
import NIOPosix
import Synchronization

/// The latest-metrics read spread over streaming standbys (`METRICSD_READ_DATABASE_URL`), never staler than
/// `maxLag`, with the primary behind them.
///
/// Each read server has its own small pool. A read goes to the least busy server that is *usable* — its last
/// probe answered, it follows this primary (``Identity``: same system identifier, same timeline; a server not in
/// recovery only when it is the primary itself), and its data is at most `maxLag` behind the primary
/// (``WALHistory``: replay position against the primary's recent WAL positions, rechecked against the clock at
/// every read, so a server that stops replaying is left when the bound runs out even between probes) — taking turns
/// among equals. With none usable the read goes to the primary. Users a standby has no row for are read again on the
/// primary before the caller computes them on request: a user just computed by another instance is not computed
/// twice. A read that fails on a standby (down, refused, cut, or no answer within ``readDeadlineSeconds``) marks it
/// down at once and is answered by the primary instead; the monitor (``run()``) probes every server, its role and
/// the primary's WAL position a few times per `maxLag` and takes a server back as soon as it answers, follows the
/// primary and has caught up.
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

        public init(
            maxLag: Duration, poolSize: Int, acquireTimeout: TimeAmount = .seconds(2), maxSessionAge: Duration? = nil
        ) {
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

    /// Why a read server is not read from, as the `reason` label of `metricsd_read_server_problem` (a fixed set).
    enum Problem: String, CaseIterable, Sendable {
        /// Refuses connections, is down, or broke a read.
        case unreachable
        /// Accepted the connection but did not answer within ``readDeadlineSeconds`` (stopped, frozen, overloaded).
        case notAnswering = "not_answering"
        /// Further behind the primary than the bound (or its position is not known yet).
        case lagging
        /// Another cluster: its system identifier is not the primary's.
        case otherCluster = "other_cluster"
        /// A standby on another timeline than the primary's: it does not follow this primary.
        case otherTimeline = "other_timeline"
        /// Not in recovery and not the primary of `DATABASE_URL`: promoted on its own, or an old primary.
        case otherPrimary = "other_primary"
        /// The primary itself, and the read URL asks for standbys (`target_session_attrs=standby`).
        case primaryNotWanted = "primary_not_wanted"
    }

    /// What was last logged about a server.
    enum Announced: Equatable, Sendable {
        case usable
        case left(Problem)
    }

    final class Server: Sendable {
        struct State {
            /// The last probe (or read) reached it.
            var up = false
            /// Its data holds every commit the primary made before this instant.
            var freshAsOf: ContinuousClock.Instant?
            /// Why it is down, when it is.
            var failure: String?
            /// It is down because it did not answer in time (rather than refused or cut).
            var unanswered = false
            /// Why it does not follow this primary, when it does not (from its last probe).
            var mismatch: (problem: Problem, detail: String)?
            var replayPaused = false
            var inFlight = 0
            var reads = 0
            /// What was last logged (a line is logged when this changes).
            var announced: Announced?

            func staleness(at now: ContinuousClock.Instant) -> Duration? {
                self.freshAsOf.map { now - $0 }
            }

            func usable(at now: ContinuousClock.Instant, maxLag: Duration) -> Bool {
                guard self.up, self.mismatch == nil, let staleness = self.staleness(at: now) else { return false }
                return staleness <= maxLag
            }

            /// Why it is not usable now (nil when it is), and in a few words.
            func problem(at now: ContinuousClock.Instant, maxLag: Duration) -> (Problem, String)? {
                if self.usable(at: now, maxLag: maxLag) { return nil }
                if let failure {
                    guard self.unanswered else { return (.unreachable, "unreachable: \(failure)") }
                    return (
                        .notAnswering, "not answering: it took a connection but did not answer within the read bound"
                    )
                }
                if let mismatch { return (mismatch.problem, mismatch.detail) }
                return (
                    .lagging,
                    ReadReplicas.lagReason(
                        staleness: self.staleness(at: now), paused: self.replayPaused, maxLag: maxLag)
                )
            }
        }

        let label: String
        let pool: PostgresPool
        /// The read URL asks for standbys only (``ConnectionSettings/ReadServer/standbysOnly``).
        let standbysOnly: Bool
        let state = Mutex(State())
        let readsCounter: Counter
        let usableGauge: Gauge
        let lagGauge: Gauge
        let problemGauges: [Problem: Gauge]

        init(label: String, pool: PostgresPool, standbysOnly: Bool) {
            self.label = label
            self.pool = pool
            self.standbysOnly = standbysOnly
            self.readsCounter = Counter(label: "metricsd_read_server_reads_total", dimensions: [("server", label)])
            self.usableGauge = Gauge(label: "metricsd_read_server_usable", dimensions: [("server", label)])
            self.lagGauge = Gauge(label: "metricsd_read_server_lag_seconds", dimensions: [("server", label)])
            self.problemGauges = Dictionary(
                uniqueKeysWithValues: Problem.allCases.map { problem in
                    (
                        problem,
                        Gauge(
                            label: "metricsd_read_server_problem",
                            dimensions: [("server", label), ("reason", problem.rawValue)])
                    )
                })
        }

        /// Records the gauges of a server `usable` or not (`problem`), `staleness` behind.
        func record(usable: Bool, staleness: Duration?, problem: Problem?) {
            self.usableGauge.record(usable ? 1 : 0)
            self.lagGauge.record(staleness.map(ReadReplicas.seconds) ?? -1)
            for (reason, gauge) in self.problemGauges { gauge.record(reason == problem ? 1 : 0) }
        }
    }

    let primary: PostgresPool
    let servers: [Server]
    let configuration: Configuration
    let logger: Logger
    /// The primary's recent WAL positions.
    let history: Mutex<WALHistory>
    /// Who the primary is (its last sample): what each read server must follow.
    let primaryIdentity = Mutex<Identity?>(nil)
    /// Runs the monitor's blocking calls on the primary (never queued behind the primary pool's requests).
    let threads: NIOThreadPool
    private let turn = Atomic<Int>(0)
    private let primaryReads = Atomic<Int>(0)
    private let primaryReadsCounter = Counter(
        label: "metricsd_read_server_reads_total", dimensions: [("server", "primary")])
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
            // Connecting waits no longer than a read: a server that accepts TCP and never answers would otherwise
            // hold a probe or a read for libpq's connect_timeout.
            settings.connectDeadlineSeconds = min(deadline, settings.connectTimeoutSeconds ?? deadline)
            let pool = PostgresPool(
                settings: settings,
                configuration: .init(
                    size: configuration.poolSize, acquireTimeout: configuration.acquireTimeout,
                    maxSessionAge: configuration.maxSessionAge, recordsMetrics: false),
                logger: logger)
            return Server(label: server.label, pool: pool, standbysOnly: server.standbysOnly)
        }
        self.threads.start()
        for server in self.servers {
            server.record(usable: false, staleness: nil, problem: .lagging)
        }
    }

    /// The latest metrics of `userIDs` (those who have any): on a usable read server, the users it lacks and every
    /// user of a failed read on the primary. The read server gets at most ``readDeadlineSeconds`` (and never past
    /// `deadline`, the caller's bound), the primary what is left until `deadline`. Its statements, on either, belong
    /// to `trace` when given (else to the task's trace, as any pooled call's).
    func read(
        userIDs: [Int64], deadline: ContinuousClock.Instant? = nil, trace: StatementTrace? = nil
    ) async throws -> [Int64: LatestMetrics] {
        var found: [Int64: LatestMetrics] = [:]
        var remaining = userIDs
        if let server = self.choose() {
            var serverDeadline = ContinuousClock.now + .nanoseconds(Int64(self.readDeadlineSeconds * 1e9))
            if let deadline { serverDeadline = min(serverDeadline, deadline) }
            do {
                found = try await server.pool.withConnection(retryOnConnectionLoss: true, deadline: serverDeadline) {
                    connection in
                    if let trace { connection.trace = trace }
                    return try PostgresStore.readLatest(userIDs: userIDs, on: connection)
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
        let more = try await self.primary.withConnection(retryOnConnectionLoss: true, deadline: deadline) {
            [remaining] connection in
            if let trace { connection.trace = trace }
            return try PostgresStore.readLatest(userIDs: remaining, on: connection)
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

    /// A read on `server` failed: a server that cannot be reached, or did not answer in time, is down until a
    /// probe reaches it again.
    private func readFailed(on server: Server, _ error: any Error) {
        let summary = (error as? PostgresError)?.summary ?? "\(error)"
        let unreachable =
            (error as? PostgresError).map { $0.code == .connectionFailed || $0.code == .connectionLost } ?? false
        if unreachable {
            self.update(server) {
                $0.up = false
                $0.failure = summary
                $0.unanswered = (error as? PostgresError)?.isUnanswered ?? false
            }
        } else {
            self.logger.warning(
                "Latest read failed on a read server; answered by the primary",
                metadata: ["metricsd.read_server": "\(server.label)", "metricsd.error": "\(error)"])
        }
    }

    /// Changes what is known of `server` (nothing: only the clock moved); records its gauges and logs when it
    /// becomes usable or stops being so, or is left for another reason than before.
    func update(_ server: Server, _ change: (inout Server.State) -> Void = { _ in }) {
        let now = ContinuousClock.now
        let maxLag = self.configuration.maxLag
        let (problem, announce, staleness) = server.state.withLock { state in
            change(&state)
            let problem = state.problem(at: now, maxLag: maxLag)
            // A line when it becomes usable or left, and when the kind of problem changes (e.g. from lagging to
            // following another primary); not for every change of lag.
            let current = problem.map { Announced.left($0.0) } ?? .usable
            let announce = state.announced != current
            state.announced = current
            return (problem, announce, state.staleness(at: now))
        }
        server.record(usable: problem == nil, staleness: staleness, problem: problem?.0)
        guard announce else { return }
        var metadata: Logger.Metadata = ["metricsd.read_server": "\(server.label)"]
        if let staleness { metadata["metricsd.read_lag_s"] = "\(Self.rounded(Self.seconds(staleness)))" }
        guard let problem else {
            self.logger.info("Reading from read server", metadata: metadata)
            return
        }
        metadata["metricsd.read_max_lag_s"] = "\(Self.rounded(Self.seconds(maxLag)))"
        metadata["metricsd.read_problem"] = "\(problem.0.rawValue)"
        metadata["metricsd.reason"] = "\(problem.1)"
        self.logger.warning(
            "Not reading from read server; reads go to the primary or another read server", metadata: metadata)
    }

    /// Why a server that follows the primary is not usable for its lag, in a few words.
    static func lagReason(staleness: Duration?, paused: Bool, maxLag: Duration) -> String {
        guard let staleness else { return "replay position not known" }
        let behind =
            "\(Self.rounded(Self.seconds(staleness))) s behind the primary (bound \(Self.rounded(Self.seconds(maxLag))) s)"
        return paused ? "replay paused, \(behind)" : behind
    }

    /// Every read server, then the primary's share.
    public func status() -> [ServerStatus] {
        let now = ContinuousClock.now
        let maxLag = self.configuration.maxLag
        var all = self.servers.map { server in
            server.state.withLock { state in
                let problem = state.problem(at: now, maxLag: maxLag)
                let staleness = state.staleness(at: now)
                return ServerStatus(
                    server: server.label, usable: problem == nil, lagSeconds: staleness.map(Self.seconds),
                    reads: state.reads,
                    problem: problem?.1)
            }
        }
        all.append(
            ServerStatus(
                server: "primary", usable: true, lagSeconds: 0, reads: self.primaryReads.load(ordering: .relaxed),
                problem: nil))
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
