import ArgumentParser
import Glibc
import MetricsdConfiguration
import MetricsdHTTP
import MetricsdSystemd

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `metricsd refresh-credentials`: the unit's `ExecReload=+…` (as root, outside the sandbox), before the `SIGHUP`.
///
/// systemd 252 reads a unit's credentials (`LoadCredential=`) when the service starts and never again, so a
/// renewed TLS certificate in `/etc/credstore` would reach the running service only with a restart. This command
/// reads the TLS certificate and key from the credential store, checks them as the service would (they parse and
/// match, the certificate has not expired, its key is strong enough: ``TLSCertificateCheck``), and puts a copy
/// the service's user alone can read in the service's runtime directory (`$RUNTIME_DIRECTORY/credentials/`), where
/// the service's reload looks first, without following any link the service's user could have planted there
/// (``RuntimeCredentials``). A pair that cannot be served, or a runtime directory that is not safe to write,
/// fails the reload (one line, exit 78), nothing is installed and the running service keeps its certificate.
/// Without TLS credentials in the store it does nothing.
struct RefreshCredentials: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "refresh-credentials",
        abstract:
            "Before a reload: copy a renewed TLS certificate and key from /etc/credstore for the running service.",
        shouldDisplay: false)

    func run() throws {
        let environment = ProcessInfo.processInfo.environment
        let store =
            environment["METRICSD_CREDSTORE"].flatMap { $0.isEmpty ? nil : $0 }
            ?? HostEnvironment.defaultCredentialStore
        let ids = ["tls-certificate", "tls-key"]
        let sources = ids.map { store + "/metricsd-" + $0 }
        guard sources.contains(where: { FileManager.default.fileExists(atPath: $0) }) else {
            print("no TLS credentials in \(store): nothing to refresh")
            return
        }
        do throws(ConfigurationError) {
            let texts = try sources.map { path throws(ConfigurationError) in try Secrets.readFile(path, what: path) }
            let certificate: TLSCertificateCheck
            do {
                certificate = try TLSIdentity.validate(certificate: texts[0], key: texts[1])
            } catch {
                throw ConfigurationError(.tlsCertificateInvalid, "\(sources[0]), \(sources[1]): \(error.message)")
            }
            let target = RuntimeCredentials(
                runtime: Secrets.runtimeDirectory(environment: environment),
                servicePID: environment["MAINPID"].flatMap { Int32($0) })
            let replaced = try target.install(zip(ids, texts).map { ($0, $1) })
            for warning in certificate.warnings.map({ "\(sources[0]): \($0)" }) + replaced {
                StandardError.write("metricsd: refresh-credentials: warning: \(warning)\n")
            }
            print(
                "refreshed tls-certificate (valid until \(ConfigCheck.date(certificate.notValidAfter)), \(certificate.key), serial \(certificate.serial)) and tls-key in \(target.path)"
            )
        } catch {
            StandardError.write("metricsd: refresh-credentials: \(error.message)\n")
            throw ExitCode(78)
        }
    }
}
