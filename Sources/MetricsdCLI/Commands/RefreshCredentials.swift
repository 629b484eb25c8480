import ArgumentParser
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Glibc
import MetricsdHTTP
import MetricsdSystemd

/// `metricsd refresh-credentials`: the unit's `ExecReload=+…` (as root, outside the sandbox), before the `SIGHUP`.
///
/// systemd 252 reads a unit's credentials (`LoadCredential=`) when the service starts and never again, so a
/// renewed TLS certificate in `/etc/credstore` would reach the running service only with a restart. This command
/// reads the TLS certificate and key from the credential store, checks them as the service would (they parse and
/// match, the certificate has not expired, its key is strong enough: ``TLSCertificateCheck``), and puts a copy
/// the service's user alone can read in the service's runtime directory (`$RUNTIME_DIRECTORY/credentials/`), where
/// the service's reload looks first. A pair that cannot be served fails the reload (one line, exit 78) and the
/// running service keeps its certificate. Without TLS credentials in the store it does nothing.
struct RefreshCredentials: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "refresh-credentials",
        abstract: "Before a reload: copy a renewed TLS certificate and key from /etc/credstore for the running service.",
        shouldDisplay: false)

    func run() throws {
        let environment = ProcessInfo.processInfo.environment
        let store = environment["METRICSD_CREDSTORE"].flatMap { $0.isEmpty ? nil : $0 } ?? HostEnvironment.defaultCredentialStore
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
            let directory = Secrets.refreshDirectory(environment: environment)
            try Self.install(zip(ids, texts).map { ($0, $1) }, in: directory)
            for warning in certificate.warnings {
                StandardError.write("metricsd: refresh-credentials: warning: \(sources[0]): \(warning)\n")
            }
            print(
                "refreshed tls-certificate (valid until \(ConfigCheck.date(certificate.notValidAfter)), \(certificate.key), serial \(certificate.serial)) and tls-key in \(directory)")
        } catch {
            StandardError.write("metricsd: refresh-credentials: \(error.message)\n")
            throw ExitCode(78)
        }
    }

    /// Writes each file (mode 0400) into `directory` (mode 0700), both owned by the owner of the directory's parent
    /// (the runtime directory, owned by the service's user), each by a rename: the service never reads half a file.
    static func install(_ files: [(name: String, text: String)], in directory: String) throws(ConfigurationError) {
        let parent = HostEnvironment.directory(of: directory)
        var owner = stat()
        guard stat(parent, &owner) == 0 else {
            throw ConfigurationError(.credentialsRefreshFailed, "\(parent) does not exist: is metricsd running? (\(Secrets.reason(errno)))")
        }
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw ConfigurationError(.credentialsRefreshFailed, "cannot create \(directory) (\(Secrets.reason(errno)))")
        }
        guard chown(directory, owner.st_uid, owner.st_gid) == 0, chmod(directory, 0o700) == 0 else {
            throw ConfigurationError(.credentialsRefreshFailed, "cannot give \(directory) to the service's user (\(Secrets.reason(errno)))")
        }
        for (name, text) in files {
            let path = directory + "/" + name
            let temporary = path + ".new"
            unlink(temporary)
            let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o400)
            guard descriptor >= 0 else { throw ConfigurationError(.credentialsRefreshFailed, "cannot write \(temporary) (\(Secrets.reason(errno)))") }
            let bytes = Array((text + "\n").utf8)
            let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            let chowned = fchown(descriptor, owner.st_uid, owner.st_gid) == 0
            close(descriptor)
            guard written == bytes.count, chowned, rename(temporary, path) == 0 else {
                unlink(temporary)
                throw ConfigurationError(.credentialsRefreshFailed, "cannot write \(path) (\(Secrets.reason(errno)))")
            }
        }
    }
}
