import Glibc
import MetricsdHTTP

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Reads secrets the way systemd deployments expect: `$CREDENTIALS_DIRECTORY/<credential>` first (`LoadCredential=`),
/// else a file named by a `*_FILE` variable, else the variable itself (development only).
///
/// File contents are trimmed of surrounding whitespace (a trailing newline from `echo` or `systemd-creds`).
/// An unreadable or empty file is an error naming the path; secrets themselves never appear in messages.
public enum Secrets {
    public static func read(
        credential: String, file fileVariable: String?, variable: String?, environment: [String: String]
    ) throws(ConfigurationError) -> String? {
        if let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty {
            // A copy refreshed since the start (`metricsd refresh-credentials`, the unit's ExecReload=) wins.
            if let refreshed = Self.refreshedCopy(credential, environment: environment) {
                return try Self.readFile(refreshed, what: "credential \(credential)")
            }
            let path = directory + "/" + credential
            if FileManager.default.fileExists(atPath: path) {
                return try Self.readFile(path, what: "credential \(credential)")
            }
        }
        if let fileVariable, let path = environment[fileVariable], !path.isEmpty {
            return try Self.readFile(path, what: fileVariable)
        }
        if let variable, let value = environment[variable], !value.isEmpty {
            return value
        }
        return nil
    }

    /// Where ``read(credential:file:variable:environment:)`` reads a credential from, as messages name it:
    /// `credential tls-certificate (PATH)` or `METRICSD_TLS_CERTIFICATE_FILE (PATH)`; nil when from nowhere.
    public static func source(credential: String, file fileVariable: String?, environment: [String: String]) -> String?
    {
        if let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty {
            if let refreshed = Self.refreshedCopy(credential, environment: environment) {
                return "credential \(credential) (\(refreshed))"
            }
            let path = directory + "/" + credential
            if FileManager.default.fileExists(atPath: path) { return "credential \(credential) (\(path))" }
        }
        if let fileVariable, let path = environment[fileVariable], !path.isEmpty {
            return "\(fileVariable) (\(path))"
        }
        return nil
    }

    /// Where `metricsd refresh-credentials` puts the credentials it refreshes: `credentials/` in the service's
    /// runtime directory (`$RUNTIME_DIRECTORY`, /run/metricsd).
    public static func refreshDirectory(environment: [String: String]) -> String {
        Self.runtimeDirectory(environment: environment) + "/credentials"
    }

    /// The service's runtime directory: the first of `$RUNTIME_DIRECTORY` (systemd may list several, `:` apart),
    /// without a trailing `/`; /run/metricsd when unset.
    package static func runtimeDirectory(environment: [String: String]) -> String {
        var runtime = Substring(environment["RUNTIME_DIRECTORY"]?.split(separator: ":").first ?? "/run/metricsd")
        while runtime.count > 1 && runtime.hasSuffix("/") { runtime.removeLast() }
        return String(runtime)
    }

    static func refreshedCopy(_ credential: String, environment: [String: String]) -> String? {
        guard environment["RUNTIME_DIRECTORY"].map({ !$0.isEmpty }) ?? false else { return nil }
        let path = Self.refreshDirectory(environment: environment) + "/" + credential
        return FileManager.default.fileExists(atPath: path) ? path : nil
    }

    package static func readFile(_ path: String, what: String) throws(ConfigurationError) -> String {
        let text: String
        do {
            text = try Self.readText(path)
        } catch {
            throw ConfigurationError(.secretUnreadable, "\(what): \(error.message)")
        }
        let trimmed = text.trimmingWhitespace()
        guard !trimmed.isEmpty else { throw ConfigurationError(.secretEmpty, "\(what): \(path) is empty") }
        return trimmed
    }

    /// The whole file as UTF-8 text (empty allowed); errors say "cannot read PATH (reason)".
    package static func readText(_ path: String) throws(ConfigurationError) -> String {
        // open(2) and read(2), not Data(contentsOf:): that refuses character devices, and /dev/null is a fine
        // empty file.
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            throw ConfigurationError(.fileUnreadable, "cannot read \(path) (\(Self.reason(errno)))")
        }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw ConfigurationError(.fileUnreadable, "cannot read \(path) (\(Self.reason(errno)))")
            }
            if count == 0 { break }
            bytes.append(contentsOf: chunk[0..<count])
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ConfigurationError(.fileUnreadable, "\(path) is not UTF-8 text")
        }
        return text
    }

    /// errno as `strerror(3)` words it, in lower case: "no such file or directory", "permission denied" …
    package static func reason(_ code: Int32) -> String {
        String(cString: strerror(code)).lowercased()
    }
}
