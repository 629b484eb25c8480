import CoreMetrics
import Glibc
import HealthMetrics
import Logging
import MetricsdConfiguration
import MetricsdHTTP
import MetricsdPostgres
import MetricsdReads
import MetricsdSystemd
import MetricsdWork
import NIOCore
import Prometheus
import ServiceLifecycle

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `metricsd serve`: start-up in systemd's order, the services, reload and shutdown (README, "systemd").
///
/// 1. configuration and credentials (errors: one line on stderr ending in the error's code, a journal record
///    carrying it as `ERROR_CODE=` under systemd, `STATUS=`/`ERRNO=`, exit 1);
/// 2. the database: retried with capped backoff while unreachable, `STATUS=waiting for database: …`, no READY;
/// 3. the schema: migrated with `--migrate` (`EXTEND_TIMEOUT_USEC` before each step), else it must be current;
/// 4. the HTTP listener bound, the scheduler running, then `READY=1` with `STATUS=serving on <addr>; …`.
/// Steps 2–4 and everything after are services of one `ServiceGroup` (``DaemonAssembly``), ordered by gates.
/// SIGHUP reloads (log level, secret files, daily time); SIGTERM/SIGINT stop gracefully, a second one at once.
public enum Daemon {
    /// Runs the daemon until it stops; returns the process exit code.
    public static func serve(environment base: [String: String], migrate: Bool) async -> Int32 {
        let early = SystemdNotifier()  // before logging exists: configuration errors only
        let earlyLogger = Self.earlyLogger(base)
        let settings: Settings
        let listeners: Listeners
        do {
            settings = try Self.readSettings(base, notifier: early, logger: earlyLogger)
            listeners = try Self.checkListeners(settings, notifier: early, logger: earlyLogger)
        } catch {
            return error.code
        }
        let (configuration, environment) = (settings.configuration, settings.environment)
        let levelBox = LogLevelBox(configuration.logLevel)
        LoggingSystem.bootstrap { label in
            LogSetup.makeHandler(
                label: label, format: configuration.logFormat, level: levelBox, environment: environment)
        }
        let logger = Logger(label: "metricsd")
        let notifier = SystemdNotifier(logger: logger)  // logs the first failed send
        logger.debug(
            "Open-file limit",
            metadata: [
                "metricsd.descriptors.needed": "\(listeners.budget.total)",
                "metricsd.descriptors.limit": "\(listeners.limit)",
            ])
        Self.warnAboutSettings(settings, logger: logger)
        // A fatal error is one `Error: …` line on stderr; in text format a log record of it would repeat it there.
        let fatalLogger: Logger? =
            LogSetup.resolvedFormat(configuration.logFormat, environment: environment) == .text ? nil : logger
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(DocumentedMetricsFactory(registry: registry))
        let database: Database
        do {
            database = try Self.openDatabase(settings, notifier: notifier, logger: logger, fatalLogger: fatalLogger)
        } catch {
            return error.code
        }
        let assembly = DaemonAssembly(
            configuration: configuration, environment: environment, reloadBase: settings.host.environment,
            migrate: migrate, tokens: database.tokens, pool: database.pool, replicas: database.replicas,
            registry: registry, levelBox: levelBox, notifier: notifier, hooks: DaemonHooks.current,
            activation: listeners.activation, logger: logger)
        Self.logListeners(listeners.activation, environment: environment, logger: logger)
        return await Self.run(assembly, database: database, fatalLogger: fatalLogger)
    }

    // MARK: Start-up phases

    /// A start-up phase that failed, its error reported (``fatal(_:code:errno:notifier:logger:)``): the exit code.
    private struct StartupExit: Error {
        let code: Int32
    }

    /// The settings `serve` runs with, read and checked before anything starts.
    private struct Settings {
        let host: HostEnvironment
        let environment: [String: String]
        let configuration: Configuration
        let readServers: [ConnectionSettings.ReadServer]
    }

    /// The listening sockets systemd passed and the open-file budget they fit in.
    private struct Listeners {
        let activation: SocketActivation
        let budget: DescriptorBudget
        /// The open-file soft limit, raised to the hard one.
        let limit: Int
    }

    /// The token verifier, the database's pool and the read servers' (nil without read servers).
    private struct Database {
        let tokens: TokenVerifier
        let pool: PostgresPool
        let replicas: ReadReplicas?
    }

    /// The configuration and credentials, the read servers and the LISTEN session's settings: errors exit with
    /// the configuration error's code.
    private static func readSettings(_ base: [String: String], notifier: SystemdNotifier, logger: Logger?)
        throws(StartupExit) -> Settings
    {
        let host: HostEnvironment
        let environment: [String: String]
        let configuration: Configuration
        do {
            host = try HostEnvironment(base)
            environment = try ConfigFile.merge(into: host.environment)
            configuration = try Configuration(environment: environment)
        } catch {
            throw StartupExit(
                code: Self.fatal(
                    "configuration error: \(error)", code: error.errorCode, errno: EINVAL, notifier: notifier,
                    logger: logger))
        }
        let readServers: [ConnectionSettings.ReadServer]
        do {
            readServers = try configuration.database.readServers(environment: environment)
            _ = try configuration.database.notify(environment: environment)  // refused here, used by the assembly
        } catch {
            throw StartupExit(
                code: Self.fatal(
                    "configuration error: \(error)", code: error.errorCode, errno: EINVAL, notifier: notifier,
                    logger: logger))
        }
        return Settings(
            host: host, environment: environment, configuration: configuration, readServers: readServers)
    }

    /// The listening sockets systemd passed (metricsd.socket), before anything else opens a descriptor; the TLS
    /// listeners they allow; the open-file limit raised and the budget checked against it.
    private static func checkListeners(_ settings: Settings, notifier: SystemdNotifier, logger: Logger?)
        throws(StartupExit) -> Listeners
    {
        let configuration = settings.configuration
        let activation: SocketActivation
        do {
            activation = try SocketActivation.fromEnvironment()
        } catch {
            throw StartupExit(
                code: Self.fatal(
                    "socket activation: \(error)", code: StartupError.Kind.listenFailed.rawValue, errno: EBADF,
                    notifier: notifier,
                    logger: logger))
        }
        // METRICSD_TLS must name listeners that exist, systemd's sockets included: never TLS nowhere, silently.
        if let problem = configuration.tlsListenerProblem(internalFromSystemd: !activation.internalSockets.isEmpty) {
            throw StartupExit(
                code: Self.fatal(
                    "configuration error: \(problem)", code: problem.errorCode, errno: EINVAL, notifier: notifier,
                    logger: logger))
        }
        // Every connection is a descriptor: the soft limit up to the hard one, and a budget that must fit it.
        let budget = DescriptorBudget(
            configuration: configuration, readServers: settings.readServers.count,
            sockets: (activation.publicSockets.count, activation.internalSockets.count))
        let descriptors = DescriptorBudget.raiseSoftLimit()
        if let problem = budget.problem(limit: descriptors.soft) {
            throw StartupExit(
                code: Self.fatal(
                    "configuration error: \(problem)", code: ConfigurationError.Kind.openFiles.rawValue,
                    errno: EINVAL, notifier: notifier, logger: logger))
        }
        return Listeners(activation: activation, budget: budget, limit: descriptors.soft)
    }

    /// Warnings about the settings: secrets others can read, trusted proxies that hold much of the internet,
    /// names no setting has.
    private static func warnAboutSettings(_ settings: Settings, logger: Logger) {
        let (host, environment) = (settings.host, settings.environment)
        let exposed = SecretExposure.warnings(
            environment: environment, settingsFile: host.settingsFile, settingsFromFile: host.settingsFromFile,
            underSystemd: host.underSystemd)
        for warning in exposed {
            logger.warning(
                "Secret readable by others: \(warning)", metadata: ["metricsd.setting": "\(warning.setting)"])
        }
        if let warning = Configuration.trustedProxiesWarning(settings.configuration.trustedProxies) {
            logger.warning("Trusted proxies: \(warning)", metadata: ["metricsd.setting": "METRICSD_TRUSTED_PROXIES"])
        }
        for name in UnknownSettings.names(in: environment) {
            logger.warning(
                "Unknown setting: \(UnknownSettings.warning(name))", metadata: ["metricsd.setting": "\(name)"])
        }
    }

    /// The token verifier, the primary's pool and the read servers' (logged when there are some).
    private static func openDatabase(
        _ settings: Settings, notifier: SystemdNotifier, logger: Logger, fatalLogger: Logger?
    ) throws(StartupExit) -> Database {
        let (configuration, environment, readServers) = (
            settings.configuration, settings.environment, settings.readServers
        )
        let tokens: TokenVerifier
        let connection: ConnectionSettings
        do {
            tokens = try TokenVerifier(configuration.tokens)
            connection = try configuration.database.primary(environment: environment)
        } catch {
            throw StartupExit(
                code: Self.fatal(
                    "configuration error: \(error)",
                    code: (error as? any CodedError)?.errorCode ?? ConfigurationError.Kind.invalidValue.rawValue,
                    errno: EINVAL, notifier: notifier, logger: fatalLogger))
        }
        let pool = PostgresPool(
            settings: connection,
            configuration: configuration.poolConfiguration, logger: logger)
        let replicas =
            readServers.isEmpty
            ? nil
            : ReadReplicas(
                primary: pool, servers: readServers, configuration: configuration.readReplicasConfiguration,
                statementDeadlineSeconds: configuration.database.statementDeadline.seconds, logger: logger)
        if let replicas {
            logger.info(
                "Latest reads on read servers",
                metadata: [
                    "metricsd.read_servers": "\(readServers.map(\.label).joined(separator: ","))",
                    "metricsd.read_max_lag_s": "\(configuration.database.readMaxLag.seconds)",
                    "metricsd.read_probe_interval_s": "\(replicas.probeIntervalSeconds)",
                ])
        }
        return Database(tokens: tokens, pool: pool, replicas: replicas)
    }

    /// The sockets systemd passed, and the former name of the internal listener's setting.
    private static func logListeners(_ activation: SocketActivation, environment: [String: String], logger: Logger) {
        if activation.isActive {
            logger.info(
                "Listening sockets from systemd",
                metadata: [
                    "metricsd.socket.public":
                        "\(Self.describe(activation.publicSockets, otherwise: "none: binds METRICSD_LISTEN"))",
                    "metricsd.socket.internal": "\(Self.describe(activation.internalSockets, otherwise: "none"))",
                ])
        }
        if environment["METRICSD_METRICS_LISTEN"].map({ !$0.isEmpty }) ?? false {
            logger.warning(
                "METRICSD_METRICS_LISTEN is the former name of METRICSD_INTERNAL_LISTEN, which also serves the admin API: rename it",
                metadata: ["metricsd.setting": "METRICSD_METRICS_LISTEN"])
        }
    }

    /// The service group, run until it stops, then the pools closed: the exit code (a certificate refused
    /// while assembling the group closes the pool and exits at once).
    private static func run(_ assembly: DaemonAssembly, database: Database, fatalLogger: Logger?) async -> Int32 {
        let (pool, replicas, notifier, logger) = (database.pool, database.replicas, assembly.notifier, assembly.logger)
        let code: Int32
        do {
            let group: ServiceGroup
            do {
                group = try assembly.group()
            } catch {
                await pool.close()
                return Self.fatal(
                    "configuration error: METRICSD_TLS: \(error)",
                    code: error.errorCode,
                    errno: EINVAL, notifier: notifier, logger: fatalLogger)
            }
            try await group.run()
            if assembly.databasePrepared.isOpen {
                logger.info("metricsd stopped")
            } else {
                notifier.stopping(status: "stopped during start-up")
                logger.info("Stopped during start-up")
            }
            code = 0
        } catch {
            let failure = Self.startupError(error, listen: assembly.configuration.listen)
            code = Self.fatal(
                failure.message, code: failure.errorCode, errno: failure.errno, notifier: notifier, logger: fatalLogger)
        }
        await replicas?.close()
        await pool.close()
        return code
    }

    /// `descriptor 3`, `descriptors 3, 4`, or `otherwise` when there are none.
    static func describe(_ descriptors: [Int32], otherwise: String) -> String {
        guard !descriptors.isEmpty else { return otherwise }
        return (descriptors.count == 1 ? "descriptor " : "descriptors ")
            + descriptors.map(String.init).joined(separator: ", ")
    }

    // MARK: Errors

    /// One line on stderr ending in the code, `STATUS=`/`ERRNO=` to systemd, a critical log record with the
    /// code as `metricsd.error.code` (when the log is not that same stderr), exit code 1.
    static func fatal(_ message: String, code: String, errno: Int32, notifier: SystemdNotifier, logger: Logger? = nil)
        -> Int32
    {
        logger?.critical("Fatal", metadata: .errorFields(message, code: code))
        StandardError.write("Error: \(message) [\(code)]\n")
        notifier.fatal(status: "failed: \(message)", errno: errno)
        return 1
    }

    /// A failure that ended the service group, as the start-up error it is.
    static func startupError(_ error: any Error, listen: ListenAddress) -> StartupError {
        switch error {
        case let error as StartupError:
            return error
        case let error as IOError:
            return StartupError(
                .listenFailed,
                message: "cannot listen on \(listen): \(String(cString: strerror(error.errnoCode)).lowercased())",
                errno: error.errnoCode)
        case let error as ServiceGroupError:
            return StartupError(.serviceFailed, message: "service failed: \(error)", errno: EIO)
        case let error as MigrationError:
            return StartupError(
                error.kind == .changed ? .migrationChanged : .migrationFailed, message: error.message, errno: EIO)
        default:
            return StartupError(.serviceFailed, message: "\(error)", errno: EIO)
        }
    }

    /// Before the configuration is read there is no log: under systemd (stderr is the journal) a journal record
    /// carries a configuration error's code as a field; elsewhere the one `Error:` line says it all.
    static func earlyLogger(_ environment: [String: String]) -> Logger? {
        guard LogSetup.resolvedFormat(nil, environment: environment) == .journal else { return nil }
        let level = LogLevelBox(.info)
        return Logger(label: "metricsd") { label in
            LogSetup.makeHandler(label: label, format: .journal, level: level, environment: environment)
        }
    }
}
