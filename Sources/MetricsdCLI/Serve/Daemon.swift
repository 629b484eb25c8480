import MetricsdDaemon
import MetricsdHTTP
import CoreMetrics
import Foundation
import HealthMetrics
import HummingbirdCore
import Logging
import MetricsdPostgres
import MetricsdSystemd
import NIOCore
import NIOPosix
import Prometheus
import ServiceLifecycle
import Synchronization
import UnixSignals

/// `metricsd serve`: start-up in systemd's order, the services, reload and shutdown (README, "systemd").
///
/// 1. configuration and credentials (errors: one line on stderr, `STATUS=`/`ERRNO=`, exit 1);
/// 2. the database: retried with capped backoff while unreachable, `STATUS=waiting for database: …`, no READY;
/// 3. the schema: migrated with `--migrate` (`EXTEND_TIMEOUT_USEC` before each step), else it must be current;
/// 4. the HTTP listener bound, the scheduler running, then `READY=1` with `STATUS=serving on <addr>; …`.
/// SIGHUP reloads (log level, secret files, daily time); SIGTERM/SIGINT stop gracefully, a second one at once.
public enum Daemon {
    /// Runs the daemon until it stops; returns the process exit code.
    public static func serve(environment base: [String: String], migrate: Bool) async -> Int32 {
        let early = SystemdNotifier()  // before logging exists: configuration errors only
        let environment: [String: String]
        let configuration: Configuration
        do {
            environment = try ConfigFile.merge(into: HostEnvironment(base).environment)
            configuration = try Configuration(environment: environment)
        } catch {
            return Self.fatal("configuration error: \(error)", errno: EINVAL, notifier: early)
        }
        let levelBox = LogLevelBox(configuration.logLevel)
        LoggingSystem.bootstrap { label in
            LogSetup.makeHandler(label: label, format: configuration.logFormat, level: levelBox, environment: environment)
        }
        let logger = Logger(label: "metricsd")
        let notifier = SystemdNotifier(logger: logger)  // logs the first failed send
        // A fatal error is one `Error: …` line on stderr; in text format a log record of it would repeat it there.
        let fatalLogger: Logger? =
            LogSetup.resolvedFormat(configuration.logFormat, environment: environment) == .text ? nil : logger
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(DocumentedMetricsFactory(registry: registry))

        let tokens: TokenVerifier
        let settings: ConnectionSettings
        do {
            tokens = try await TokenVerifier(configuration.tokens)
            settings = try configuration.connectionSettings(environment: environment)
        } catch {
            return Self.fatal("configuration error: \(error)", errno: EINVAL, notifier: notifier, logger: fatalLogger)
        }
        let pool = PostgresPool(
            settings: settings,
            configuration: .init(
                size: configuration.poolSize, acquireTimeout: .milliseconds(Int64(configuration.acquireTimeoutMilliseconds)),
                maxSessionAge: .milliseconds(Int64(configuration.sessionMaxAgeSeconds * 1000))),
            logger: logger)
        let lifecycle = Lifecycle()
        let signals = Task { await Self.watchSignals(lifecycle: lifecycle, notifier: notifier, logger: logger) }
        defer { signals.cancel() }

        let code: Int32
        do {
            try await lifecycle.startup { try await Self.prepareDatabase(pool: pool, migrate: migrate, notifier: notifier, logger: logger) }
            code = try await Self.run(
                configuration: configuration, environment: environment, tokens: tokens, pool: pool, registry: registry,
                levelBox: levelBox, lifecycle: lifecycle, notifier: notifier, logger: logger)
        } catch is CancellationError {
            notifier.stopping(status: "stopped during start-up")
            logger.info("Stopped during start-up")
            code = 0
        } catch let error as StartupError {
            code = Self.fatal(error.message, errno: error.errno, notifier: notifier, logger: fatalLogger)
        } catch {
            code = Self.fatal(
                Self.describe(error, listen: configuration.listen), errno: Self.errno(of: error), notifier: notifier,
                logger: fatalLogger)
        }
        await pool.close()
        return code
    }

    // MARK: Start-up

    struct StartupError: Error {
        let message: String
        let errno: Int32
    }

    /// Waits for the database (capped backoff, one log line per distinct failure), then checks or migrates the
    /// schema.
    static func prepareDatabase(pool: PostgresPool, migrate: Bool, notifier: SystemdNotifier, logger: Logger) async throws {
        var lastProblem: String?
        var delay = Duration.milliseconds(250)
        while true {
            try Task.checkCancellation()
            do {
                _ = try await pool.withConnection { try $0.query("SELECT 1") }
                if lastProblem != nil { logger.info("Database reachable") }
                break
            } catch let error as PostgresError where error.code != .badConnectionString {
                let problem = error.message
                if problem != lastProblem {
                    logger.warning("Waiting for database", metadata: ["metricsd.error": "\(problem)"])
                    notifier.status("waiting for database: \(problem)")
                    lastProblem = problem
                }
                try await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(10))
            }
        }
        let migrator = Migrator()
        let status = try await pool.withConnection { try migrator.status(on: $0) }
        if let changed = status.changed.first {
            throw StartupError(
                message: "migration \(changed) was changed after it was applied; restore it and add a new migration",
                errno: EINVAL)
        }
        if !status.unknown.isEmpty {
            logger.warning(
                "The database has migrations this build does not know (a newer metricsd applied them)",
                metadata: ["metricsd.migrations": "\(status.unknown.joined(separator: ","))"])
        }
        guard !status.pending.isEmpty else { return }
        guard migrate else {
            throw StartupError(message: PostgresStore.describe(status), errno: EINVAL)
        }
        notifier.status("migrating: \(status.pending.count) pending")
        let applied = try await pool.withConnection { connection in
            try migrator.migrate(on: connection, logger: logger) { name, step, total in
                notifier.extendTimeout(by: .seconds(60))
                notifier.status("migrating \(step)/\(total): \(name)")
            }
        }
        logger.info("Schema migrated", metadata: ["metricsd.migrations": "\(applied.joined(separator: ","))"])
        // The last step's extension may be nearly used up: cover binding the listener and starting the scheduler.
        notifier.extendTimeout(by: .seconds(30))
    }

    // MARK: Running

    static func run(
        configuration: Configuration, environment: [String: String], tokens: TokenVerifier, pool: PostgresPool,
        registry: PrometheusCollectorRegistry, levelBox: LogLevelBox, lifecycle: Lifecycle, notifier: SystemdNotifier,
        logger: Logger
    ) async throws -> Int32 {
        let formula = configuration.formula
        let identity = Instances.Identity(
            id: "\(ProcessInfo.processInfo.hostName):\(getpid()):\(String(UInt16.random(in: 0...UInt16.max), radix: 16))",
            host: ProcessInfo.processInfo.hostName, pid: getpid(), buildVersion: BuildInfo.version,
            formulaVersion: formula.version, listen: configuration.listen.description)
        var queue = WorkQueue(
            pool: pool, formula: formula, owner: identity.id, configuration: configuration.work, logger: logger)
        if let delay = configuration.faults.batchDelayMilliseconds {
            queue.faults.beforeCommit = { _, _ in usleep(UInt32(delay) * 1000) }
        }
        let store = PostgresStore(pool: pool, formula: formula, readRunners: configuration.readBatches, logger: logger)
        let jobs = RecomputeJobs(pool: pool, chunkSize: configuration.work.chunkSize)
        let credentials = CredentialBox(
            .init(tokens: tokens, admin: configuration.adminToken.map { AdminTokenCheck(token: $0) }))
        let dailyAt = ReadMostly(configuration.dailyAt)
        let liveness = Liveness()
        let signal = WorkSignal()
        let started = StartupGate()
        let listening = ListeningGate()
        let status = StatusBoard(notifier: notifier)
        let reporter = OperatorMetrics(status: StatusQueries(pool: pool), jobs: jobs, version: formula.version)

        var schedulerConfiguration = Scheduler.Configuration()
        schedulerConfiguration.tick = .milliseconds(Int64(configuration.tickSeconds * 1000))
        schedulerConfiguration.idlePoll = .milliseconds(Int64(configuration.idlePollSeconds * 1000))
        schedulerConfiguration.workers = configuration.workers
        schedulerConfiguration.stallAfterTicks = configuration.faults.stallSchedulerAfterTicks
        let scheduler = Scheduler(
            queue: queue, dailyAt: dailyAt, configuration: schedulerConfiguration, liveness: liveness, signal: signal,
            started: started, status: status, reporter: reporter, logger: logger)

        let requestLog = RequestLog(mode: configuration.requestLog, logger: Self.requestLogger(configuration, environment))
        let dependencies = HTTPDependencies(
            store: store, jobs: configuration.adminToken == nil ? nil : jobs, credentials: credentials,
            formula: formula, prometheus: configuration.metricsListen == nil ? registry : nil,
            maxInFlight: configuration.maxInFlight, requestLog: requestLog)
        let requestTimeout = TimeAmount.milliseconds(Int64(configuration.requestTimeoutSeconds * 1000))
        let idleTimeout = TimeAmount.milliseconds(Int64(configuration.idleTimeoutSeconds * 1000))
        let writeTimeout = TimeAmount.milliseconds(Int64(configuration.writeTimeoutSeconds * 1000))
        let server = buildAPIServer(
            dependencies, address: configuration.listen, requestTimeout: requestTimeout, idleTimeout: idleTimeout,
            writeTimeout: writeTimeout,
            maxConnections: configuration.maxConnections,
            onServerRunning: { channel in
                listening.open()
                await started.wait()
                let address = channel.localAddress.map(Self.describe) ?? configuration.listen.description
                status.serving(on: address)
                notifier.ready(status: status.line)
                logger.info(
                    "metricsd ready",
                    metadata: [
                        "metricsd.listen": "\(address)", "metricsd.formula.version": "\(formula.version)",
                        "metricsd.instance": "\(identity.id)",
                    ])
            },
            logger: logger)

        var services: [any Service] = []
        if let watchdog = WatchdogConfiguration.fromEnvironment() {
            services.append(
                WatchdogService(
                    configuration: watchdog, notifier: notifier, liveness: liveness,
                    eventLoopGroup: MultiThreadedEventLoopGroup.singleton, logger: logger))
        }
        // The work starts once the listener is bound (start-up order); a taken port means no work at all.
        services.append(
            AfterListening(
                listening,
                InstanceHeartbeat(instances: Instances(pool: pool), identity: identity, interval: .seconds(10), logger: logger)))
        services.append(
            AfterListening(
                listening, SettingsListener(pool: pool, queue: queue, signal: signal, sweepInterval: .seconds(30), logger: logger)))
        services.append(AfterListening(listening, scheduler))
        if let metricsListen = configuration.metricsListen {
            services.append(
                buildAPIServer(
                    dependencies, endpoints: .metrics(registry), address: metricsListen, requestTimeout: requestTimeout,
                    idleTimeout: idleTimeout, writeTimeout: writeTimeout, logger: logger))
        }
        services.append(server)

        var groupConfiguration = ServiceGroupConfiguration(
            services: services.map { .init(service: $0) }, gracefulShutdownSignals: [], cancellationSignals: [],
            logger: logger)
        groupConfiguration.maximumGracefulShutdownDuration = .milliseconds(Int64(configuration.shutdownSeconds * 1000))
        groupConfiguration.maximumCancellationDuration = .seconds(5)
        let group = ServiceGroup(configuration: groupConfiguration)
        let reload: @Sendable () async -> Void = {
            await Self.reload(
                base: environment, levelBox: levelBox, dailyAt: dailyAt, credentials: credentials,
                requestLog: requestLog, status: status, notifier: notifier, logger: logger)
        }
        try await lifecycle.running(group: group, reload: reload)
        logger.info("metricsd stopped")
        return 0
    }

    // MARK: Signals

    /// First SIGTERM/SIGINT: `STOPPING=1` and a graceful stop; a second one: exit at once. SIGHUP: reload.
    static func watchSignals(lifecycle: Lifecycle, notifier: SystemdNotifier, logger: Logger) async {
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint, .sighup)
        var stopping = false
        for await signal in signals {
            switch signal {
            case .sighup:
                await lifecycle.reload(notifier: notifier, logger: logger)
            default:
                if stopping {
                    logger.warning("Second stop signal: exiting at once", metadata: ["metricsd.signal": "\(signal)"])
                    exit(1)
                }
                stopping = true
                notifier.stopping(status: "stopping: finishing requests and the current batch")
                logger.info("Stopping", metadata: ["metricsd.signal": "\(signal)"])
                await lifecycle.stop()
            }
        }
    }

    /// Re-reads what can change without a restart: log level and daily time (from `METRICSD_CONFIG_FILE`), and
    /// the secret files (JWT secret or public key, admin token). Everything else needs a restart.
    static func reload(
        base: [String: String], levelBox: LogLevelBox, dailyAt: ReadMostly<DailyTime>, credentials: CredentialBox,
        requestLog: RequestLog, status: StatusBoard, notifier: SystemdNotifier, logger: Logger
    ) async {
        do {
            let environment = try ConfigFile.merge(into: base)
            let configuration = try Configuration(environment: environment)
            let tokens = try await TokenVerifier(configuration.tokens)
            levelBox.level = configuration.logLevel
            dailyAt.value = configuration.dailyAt
            requestLog.mode = configuration.requestLog
            credentials.replace(.init(tokens: tokens, admin: configuration.adminToken.map { AdminTokenCheck(token: $0) }))
            logger.info(
                "Reloaded",
                metadata: [
                    "metricsd.log.level": "\(configuration.logLevel)", "metricsd.daily_at": "\(configuration.dailyAt)",
                    "metricsd.request_log": "\(configuration.requestLog.rawValue)",
                    "metricsd.jwt.algorithms": "\(tokens.acceptedAlgorithms.joined(separator: ","))",
                ])
            notifier.ready(status: status.line)
        } catch {
            logger.error("Reload failed; keeping the previous settings", metadata: ["metricsd.error": "\(error)"])
            notifier.ready(status: "reload failed: \(error); " + status.line)
        }
    }

    /// The request log's own logger: the configured format, its level fixed at `info` (the request log has its
    /// own switch, `METRICSD_REQUEST_LOG`, independent of `METRICSD_LOG_LEVEL`).
    static func requestLogger(_ configuration: Configuration, _ environment: [String: String]) -> Logger {
        let level = LogLevelBox(.info)
        return Logger(label: "metricsd") { label in
            LogSetup.makeHandler(label: label, format: configuration.logFormat, level: level, environment: environment)
        }
    }

    // MARK: Errors

    /// One line on stderr, `STATUS=`/`ERRNO=` to systemd, exit code 1.
    static func fatal(_ message: String, errno: Int32, notifier: SystemdNotifier, logger: Logger? = nil) -> Int32 {
        logger?.critical("Fatal", metadata: ["metricsd.error": "\(message)"])
        FileHandle.standardError.write(Data("Error: \(message)\n".utf8))
        notifier.fatal(status: "failed: \(message)", errno: errno)
        return 1
    }

    static func describe(_ error: any Error, listen: ListenAddress) -> String {
        if let error = error as? IOError {
            return "cannot listen on \(listen): \(String(cString: strerror(error.errnoCode)).lowercased())"
        }
        if let error = error as? ServiceGroupError {
            return "service failed: \(error)"
        }
        return "\(error)"
    }

    static func errno(of error: any Error) -> Int32 {
        (error as? IOError)?.errnoCode ?? EIO
    }

    static func describe(_ address: SocketAddress) -> String {
        guard let ip = address.ipAddress, let port = address.port else { return "\(address)" }
        return ip.contains(":") ? "[\(ip)]:\(port)" : "\(ip):\(port)"
    }
}

