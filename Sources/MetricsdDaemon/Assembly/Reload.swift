import HealthMetrics
import Logging
import MetricsdConfiguration
import MetricsdHTTP
import MetricsdReads
import MetricsdSystemd
import MetricsdWork

/// `systemctl reload` (SIGHUP): re-reads `METRICSD_CONFIG_FILE` and takes the settings the catalogue marks
/// reloadable (``ReloadedSettings``) — log level, request log, daily time, the token and admin-token settings
/// with the secrets' files, and the TLS certificate and key (new connections get them; open ones keep theirs).
/// A change to any other setting is named in a notice as waiting for a restart. The whole file is checked as a
/// restart would read it: a value that would fail the next start fails the reload, which keeps the previous
/// settings and says why in `STATUS=`. Before the daemon is ready there is nothing to reload into: the signal is
/// logged and ignored (no `RELOADING=1`, whose `READY=1` would tell systemd the start-up had finished).
struct Reload: Sendable {
    /// The environment before `METRICSD_CONFIG_FILE` is merged in: a setting taken out of the file falls back to
    /// it.
    let base: [String: String]
    /// The environment the running configuration was read from.
    let running: ReadMostly<[String: String]>
    let levelBox: LogLevelBox
    let dailyAt: ReadMostly<DailyTime>
    let credentials: CredentialBox
    let requestLog: RequestLog
    let status: StatusBoard
    let notifier: SystemdNotifier
    let ready: Gate
    /// The listeners' certificate, when TLS is on.
    var tls: TLSIdentity? = nil
    let logger: Logger

    @Sendable func callAsFunction() async {
        guard self.ready.isOpen else {
            self.logger.notice("Reload ignored: still starting")
            return
        }
        self.notifier.reloading()
        do {
            let current = try ConfigFile.merge(into: self.base)
            let reloaded = ReloadedSettings(current: current, running: self.running.value)
            // Only what waits for a restart is not read below: a value there that would fail the next start fails
            // the reload now.
            if !reloaded.waitingForRestart.isEmpty { _ = try Configuration(environment: current) }
            let environment = reloaded.environment
            let configuration = try Configuration(environment: environment)
            let tokens = try TokenVerifier(configuration.tokens)
            if let identity = self.tls {
                let (certificate, key) = try TLSSettings.read(environment: environment)
                let source = TLSSettings.source(environment: environment)
                do {
                    let loaded = try identity.replace(certificate: certificate, key: key)
                    DaemonAssembly.logCertificate(loaded, source: source, logger: self.logger)
                } catch {
                    throw error.from(source)
                }
            }
            self.running.value = environment
            self.levelBox.level = configuration.logLevel
            self.dailyAt.value = configuration.dailyAt
            self.requestLog.mode = configuration.requestLog
            self.credentials.replace(
                .init(tokens: tokens, admin: configuration.adminToken.map { AdminTokenCheck(token: $0) }))
            self.logger.info(
                "Reloaded",
                metadata: [
                    "metricsd.log.level": "\(configuration.logLevel)", "metricsd.daily_at": "\(configuration.dailyAt)",
                    "metricsd.request_log": "\(configuration.requestLog.rawValue)",
                    "metricsd.jwt.algorithms": "\(tokens.acceptedAlgorithms.joined(separator: ","))",
                ])
            if !reloaded.waitingForRestart.isEmpty {
                self.logger.notice(
                    "Reload: changed settings that take effect at the next restart",
                    metadata: ["metricsd.settings": "\(reloaded.waitingForRestart.joined(separator: ","))"])
            }
            self.notifier.ready(status: self.status.line)
        } catch {
            self.logger.error("Reload failed; keeping the previous settings", metadata: .errorFields(error))
            self.notifier.ready(status: "reload failed: \(error); " + self.status.line)
        }
    }
}
