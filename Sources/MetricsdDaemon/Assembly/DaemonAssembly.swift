import CoreMetrics
import Glibc
import HealthMetrics
import Logging
import MetricsdConfiguration
import MetricsdHTTP
import MetricsdPostgres
import MetricsdReads
import MetricsdSystemd
import MetricsdTracing
import MetricsdWork
import NIOCore
import NIOPosix
import Prometheus
import ServiceLifecycle
import UnixSignals

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The daemon's parts, wired once from the configuration, and the one `ServiceGroup` that runs them.
///
/// Start-up order comes from gates, not from the order of the list: the listeners wait until the database is
/// prepared; the heartbeat, the settings listener and the scheduler until the API listener is bound (a port in
/// use means no work at all); `READY=1` until the scheduler runs. Shutdown runs the list backwards: the listeners
/// stop accepting and drain first, then the scheduler finishes its batches and hands unfinished work back, and
/// the signal watcher (first in the list) hears a second stop signal until the very end.
struct DaemonAssembly {
    let configuration: Configuration
    let environment: [String: String]
    /// The environment before `METRICSD_CONFIG_FILE` was merged into it: what a reload merges the file into
    /// again, so that a setting taken out of the file falls back to the environment's value or its default.
    let reloadBase: [String: String]
    let migrate: Bool
    let tokens: TokenVerifier
    let pool: PostgresPool
    /// The latest read's read servers (`METRICSD_READ_DATABASE_URL`), nil without.
    let replicas: ReadReplicas?
    let registry: PrometheusCollectorRegistry
    let levelBox: LogLevelBox
    let notifier: SystemdNotifier
    let hooks: DaemonHooks
    /// The listening sockets systemd passed (socket activation), if any.
    let activation: SocketActivation
    let logger: Logger

    /// Opens once the database answers and the schema is current.
    let databasePrepared = Gate()
    /// Opens once the API listener is bound.
    let listening = Gate()
    /// Opens once the scheduler runs.
    let schedulerStarted = Gate()
    /// Opens once `READY=1` is sent.
    let ready = Gate()

    init(
        configuration: Configuration, environment: [String: String], reloadBase: [String: String], migrate: Bool,
        tokens: TokenVerifier, pool: PostgresPool, replicas: ReadReplicas?, registry: PrometheusCollectorRegistry,
        levelBox: LogLevelBox, notifier: SystemdNotifier, hooks: DaemonHooks,
        activation: SocketActivation = SocketActivation(), logger: Logger
    ) {
        self.configuration = configuration
        self.environment = environment
        self.reloadBase = reloadBase
        self.migrate = migrate
        self.tokens = tokens
        self.pool = pool
        self.replicas = replicas
        self.registry = registry
        self.levelBox = levelBox
        self.notifier = notifier
        self.hooks = hooks
        self.activation = activation
        self.logger = logger
    }

    /// Migrations (with `serve --migrate`) and the schema check before anything else uses the database.
    private func databasePreparation(directSettings: ConnectionSettings?) -> DatabasePreparation {
        var preparation = DatabasePreparation(
            pool: self.pool, migrate: self.migrate, notifier: self.notifier, prepared: self.databasePrepared,
            logger: self.logger)
        preparation.directSettings = directSettings
        return preparation
    }

    func group() throws(TLSIdentityError) -> ServiceGroup {
        let configuration = self.configuration
        let parts = self.parts()
        let tls = try configuration.tls.map { settings throws(TLSIdentityError) in
            try self.tlsIdentity(settings)
        }
        let requestLog = RequestLog(mode: configuration.requestLog, logger: self.requestLogger())
        let internalSockets = self.internalSockets
        if configuration.tls?.onPublic == true { tls?.exportExpiry(listener: "public") }
        if configuration.tls?.onInternal == true, !internalSockets.isEmpty { tls?.exportExpiry(listener: "internal") }
        var dependencies = HTTPDependencies(
            store: parts.store, jobs: configuration.adminToken == nil ? nil : parts.jobs,
            credentials: parts.credentials, formula: configuration.formula,
            prometheus: internalSockets.isEmpty ? self.registry : nil, maxInFlight: configuration.maxInFlight,
            requestLog: requestLog)
        dependencies.trustedProxies = configuration.trustedProxies
        let server = self.publicServer(
            dependencies, endpoints: internalSockets.isEmpty ? .api : .public, tls: tls, status: parts.status,
            identity: parts.identity)
        let reload = Reload(
            base: self.reloadBase, running: ReadMostly(self.environment), levelBox: self.levelBox,
            dailyAt: parts.dailyAt, credentials: parts.credentials,
            requestLog: requestLog, status: parts.status, notifier: self.notifier, ready: self.ready, tls: tls,
            logger: self.logger)

        // Checked at start.
        let notifySettings = (try? configuration.database.notify(environment: self.environment)) ?? nil
        var services = self.lifecycleServices(reload: reload, liveness: parts.liveness)
        services += self.databaseServices(parts, notifySettings: notifySettings)
        services += self.workServices(parts, notifySettings: notifySettings, notifications: dependencies.notifications)
        services += self.listenerServices(dependencies, internalSockets: internalSockets, tls: tls, server: server)
        var groupConfiguration = ServiceGroupConfiguration(
            services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: self.logger)
        groupConfiguration.maximumGracefulShutdownDuration = configuration.shutdown
        groupConfiguration.maximumCancellationDuration = .seconds(5)
        return ServiceGroup(configuration: groupConfiguration)
    }

    /// What the services of one group share: the instance, the work queue and scheduler, the store, the
    /// credentials and what reload changes, the liveness and status the scheduler reports.
    struct Parts {
        let identity: Instances.Identity
        let queue: WorkQueue
        let store: PostgresStore
        let jobs: RecomputeJobs
        let credentials: CredentialBox
        let dailyAt: ReadMostly<DailyTime>
        let liveness: Liveness
        let signal: WorkSignal
        let status: StatusBoard
        let scheduler: Scheduler
        /// How often idle workers look for work queued by others (the settings listener polls as often).
        let idlePoll: Duration
    }

    /// The group's shared parts, `metricsd_build_info` recorded.
    func parts() -> Parts {
        let configuration = self.configuration
        let formula = configuration.formula
        let identity = Instances.Identity(
            id:
                "\(ProcessInfo.processInfo.hostName):\(getpid()):\(String(UInt16.random(in: 0...UInt16.max), radix: 16))",
            host: ProcessInfo.processInfo.hostName, pid: getpid(), buildVersion: BuildInfo.version,
            formulaVersion: formula.version, listen: configuration.listen.description)
        var queue = WorkQueue(
            pool: self.pool, formula: formula, owner: identity.id, configuration: configuration.work,
            logger: self.logger)
        queue.faults.beforeCommit = self.hooks.beforeCommit
        let store = PostgresStore(
            pool: self.pool, formula: formula, readRunners: configuration.readBatches, replicas: self.replicas,
            logger: self.logger)
        let jobs = RecomputeJobs(pool: self.pool, chunkSize: configuration.work.chunkSize)
        let credentials = CredentialBox(
            .init(tokens: self.tokens, admin: configuration.adminToken.map { AdminTokenCheck(token: $0) }))
        let dailyAt = ReadMostly(configuration.dailyAt)
        let liveness = Liveness()
        let signal = WorkSignal()
        let status = StatusBoard(notifier: self.notifier)
        let reporter = OperatorMetrics(
            status: StatusQueries(pool: self.pool), jobs: jobs, version: formula.version,
            retentionDays: configuration.retentionDays)
        Gauge(
            label: "metricsd_build_info",
            dimensions: [("version", BuildInfo.version), ("formula_version", String(formula.version))]
        )
        .record(1)

        var schedulerConfiguration = Scheduler.Configuration()
        schedulerConfiguration.tick = configuration.tick
        schedulerConfiguration.idlePoll = configuration.idlePoll
        schedulerConfiguration.workers = configuration.workers
        schedulerConfiguration.retentionDays = configuration.retentionDays
        schedulerConfiguration.beforeTick = self.hooks.beforeTick
        let scheduler = Scheduler(
            queue: queue, dailyAt: dailyAt, configuration: schedulerConfiguration, liveness: liveness, signal: signal,
            started: self.schedulerStarted.open, status: status, reporter: reporter, logger: self.logger)
        return Parts(
            identity: identity, queue: queue, store: store, jobs: jobs, credentials: credentials, dailyAt: dailyAt,
            liveness: liveness, signal: signal, status: status, scheduler: scheduler,
            idlePoll: schedulerConfiguration.idlePoll)
    }

    /// First in the list, so last to stop: the signal watcher (stop and reload signals), the trace exporter, the
    /// watchdog.
    func lifecycleServices(reload: Reload, liveness: Liveness) -> [ServiceGroupConfiguration.ServiceConfiguration] {
        let (notifier, logger) = (self.notifier, self.logger)
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(
                service: SignalService(
                    stopping: { signal in
                        notifier.stopping(status: "stopping: finishing requests and the current batch")
                        logger.info("Stopping", metadata: ["metricsd.signal": "\(signal)"])
                    },
                    reload: reload.callAsFunction, logger: self.logger))
        ]
        // Early in the list, so late in shutdown: the spans of the last requests and batches are sent before it ends.
        if let tracing = self.configuration.tracing {
            self.logger.info(
                "Tracing on",
                metadata: [
                    "metricsd.trace.endpoint": "\(tracing.endpoint)", "metricsd.trace.sampler": "\(tracing.sampler)",
                    "metricsd.trace.service_name": "\(tracing.serviceName)",
                ])
            services.append(.init(service: Traces.install(tracing, logger: self.logger)))
        }
        if let watchdog = WatchdogConfiguration.fromEnvironment() {
            services.append(
                .init(
                    service: WatchdogService(
                        configuration: watchdog, notifier: self.notifier, liveness: liveness,
                        eventLoopGroup: MultiThreadedEventLoopGroup.singleton, logger: self.logger)))
        }
        return services
    }

    /// The database prepared (migrations, the schema check), the batched latest reads, the read servers.
    func databaseServices(_ parts: Parts, notifySettings: ConnectionSettings?)
        -> [ServiceGroupConfiguration.ServiceConfiguration]
    {
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(
                service: self.databasePreparation(directSettings: notifySettings),
                successTerminationBehavior: .ignore),
            .init(service: parts.store.readBatches),
        ]
        if let replicas = self.replicas { services.append(.init(service: replicas)) }
        return services
    }

    /// Once the API listener is bound: the instance heartbeat, the settings listener, the scheduler, and the
    /// history move when this instance takes part.
    func workServices(
        _ parts: Parts, notifySettings: ConnectionSettings?, notifications: NotificationStatus
    ) -> [ServiceGroupConfiguration.ServiceConfiguration] {
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
        services.append(
            .init(
                service: Gated(
                    after: self.listening,
                    InstanceHeartbeat(
                        instances: Instances(pool: self.pool), identity: parts.identity, interval: .seconds(10),
                        replicas: self.replicas, logger: self.logger))))
        services.append(
            .init(
                service: Gated(
                    after: self.listening,
                    SettingsListener(
                        pool: self.pool, queue: parts.queue, signal: parts.signal, sweepInterval: .seconds(30),
                        logger: self.logger, notifySettings: notifySettings, pollInterval: parts.idlePoll,
                        status: notifications))))
        services.append(.init(service: Gated(after: self.listening, parts.scheduler)))
        if self.configuration.historyMove {
            // Returns once there is nothing (left) to move.
            services.append(
                .init(
                    service: Gated(after: self.listening, HistoryMover(queue: parts.queue, logger: self.logger)),
                    successTerminationBehavior: .ignore))
        }
        return services
    }

    /// Once the database is prepared: the internal listener (when there is one), then the public one, last in
    /// the list so first to stop accepting.
    func listenerServices(
        _ dependencies: HTTPDependencies, internalSockets: [ListenerSocket], tls: TLSIdentity?, server: HTTPServer
    ) -> [ServiceGroupConfiguration.ServiceConfiguration] {
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
        if !internalSockets.isEmpty {
            let timeouts = self.timeouts
            services.append(
                .init(
                    service: Gated(
                        after: self.databasePrepared,
                        buildAPIServer(
                            dependencies, endpoints: .internal(self.registry), sockets: internalSockets,
                            requestTimeout: timeouts.request, idleTimeout: timeouts.idle, writeTimeout: timeouts.write,
                            tls: self.configuration.tls?.onInternal == true ? tls : nil,
                            connectionLimit: .init(
                                listener: "internal", maximum: self.configuration.internalMaxConnections,
                                setting: "METRICSD_INTERNAL_MAX_CONNECTIONS"),
                            logger: self.logger))))
        }
        services.append(.init(service: Gated(after: self.databasePrepared, server)))
        return services
    }

    /// The public listener's sockets: those systemd passed (one per `ListenStream=` of metricsd.socket), else
    /// `METRICSD_LISTEN`.
    var publicSockets: [ListenerSocket] {
        self.activation.publicSockets.isEmpty
            ? [.bind(self.configuration.listen)]
            : self.activation.publicSockets.map { .inherited(descriptor: $0, name: "public") }
    }

    /// The internal listener's sockets: those systemd passed (metricsd-internal.socket), else
    /// `METRICSD_INTERNAL_LISTEN`; none without either.
    var internalSockets: [ListenerSocket] {
        if !self.activation.internalSockets.isEmpty {
            return self.activation.internalSockets.map { .inherited(descriptor: $0, name: "internal") }
        }
        return self.configuration.internalListen.map { [.bind($0)] } ?? []
    }

    var timeouts: (request: TimeAmount, idle: TimeAmount, write: TimeAmount) {
        (
            TimeAmount(self.configuration.requestTimeout), TimeAmount(self.configuration.idleTimeout),
            TimeAmount(self.configuration.writeTimeout)
        )
    }

    /// The public listener's server. Once every socket accepts it opens the `listening` gate; once the scheduler
    /// runs too, it reports READY with the addresses it serves.
    func publicServer(
        _ dependencies: HTTPDependencies, endpoints: HTTPEndpoints, tls: TLSIdentity?, status: StatusBoard,
        identity: Instances.Identity
    ) -> HTTPServer {
        let configuration = self.configuration
        let (listening, started, ready, notifier, logger) = (
            self.listening, self.schedulerStarted, self.ready, self.notifier, self.logger
        )
        let timeouts = self.timeouts
        return buildAPIServer(
            dependencies, endpoints: endpoints, sockets: self.publicSockets,
            requestTimeout: timeouts.request, idleTimeout: timeouts.idle, writeTimeout: timeouts.write,
            tls: configuration.tls?.onPublic == true ? tls : nil,
            connectionLimit: .init(
                listener: "public", maximum: configuration.maxConnections, setting: "METRICSD_MAX_CONNECTIONS"),
            onServerRunning: { channels in
                listening.open()
                guard await started.wait() else { return }
                let addresses = channels.compactMap(\.localAddress).map(Self.describe)
                let address = addresses.isEmpty ? configuration.listen.description : addresses.joined(separator: ", ")
                status.serving(on: address)
                notifier.ready(status: status.line)
                ready.open()
                logger.info(
                    "metricsd ready",
                    metadata: [
                        "metricsd.listen": "\(address)", "metricsd.formula.version": "\(configuration.formula.version)",
                        "metricsd.instance": "\(identity.id)",
                    ])
            },
            logger: self.logger)
    }

    /// The listeners' certificate: refused (expired, a weak key) with where it came from in the message; logged
    /// with its expiry, and at warning level with what needs attention (expiring soon, not valid yet).
    func tlsIdentity(_ settings: TLSSettings) throws(TLSIdentityError) -> TLSIdentity {
        let identity: TLSIdentity
        do {
            identity = try TLSIdentity(certificate: settings.certificate, key: settings.key)
        } catch {
            throw error.from(settings.source)
        }
        Self.logCertificate(identity.certificate, source: settings.source, logger: self.logger)
        return identity
    }

    /// "TLS certificate loaded" with its expiry, serial and key, then each warning about it.
    static func logCertificate(_ certificate: TLSCertificateCheck, source: String, logger: Logger) {
        let fields: Logger.Metadata = [
            "metricsd.tls.valid_until": "\(TLSCertificateCheck.date(certificate.notValidAfter))",
            "metricsd.tls.serial": "\(certificate.serial)", "metricsd.tls.key": "\(certificate.key)",
            "metricsd.tls.source": "\(source)",
        ]
        logger.info("TLS certificate loaded", metadata: fields)
        for warning in certificate.warnings {
            logger.warning(
                "TLS certificate needs attention",
                metadata: fields.merging(["metricsd.tls.problem": "\(warning)"]) { $1 })
        }
    }

    /// The request log's own logger: the configured format, its level fixed at `info` (the request log has its
    /// own switch, `METRICSD_REQUEST_LOG`, independent of `METRICSD_LOG_LEVEL`).
    func requestLogger() -> Logger {
        let level = LogLevelBox(.info)
        let (format, environment) = (self.configuration.logFormat, self.environment)
        return Logger(label: "metricsd") { label in
            LogSetup.makeHandler(label: label, format: format, level: level, environment: environment)
        }
    }

    static func describe(_ address: SocketAddress) -> String {
        guard let ip = address.ipAddress, let port = address.port else { return "\(address)" }
        return ip.contains(":") ? "[\(ip)]:\(port)" : "\(ip):\(port)"
    }
}
