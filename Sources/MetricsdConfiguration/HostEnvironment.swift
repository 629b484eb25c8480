import Glibc
import MetricsdHTTP

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The configuration of `metricsd` run by hand on the host: the same settings file and credentials the service
/// gets from its unit, so that `sudo metricsd status` or `metricsd healthcheck` need nothing exported.
///
/// Under systemd (`INVOCATION_ID` or `CREDENTIALS_DIRECTORY` set) the unit has already done this
/// (`EnvironmentFile=`, `LoadCredential=`): the environment is used as it is. Otherwise:
/// 1. the settings file, `METRICSD_ENV_FILE` (default `/etc/metricsd/metricsd.env`; optional unless named
///    explicitly without a leading `-`), fills in every setting the environment does not set: an exported variable always wins;
/// 2. `METRICSD_CONFIG_FILE` defaults to `-<that directory>/metricsd.conf`, as in the unit;
/// 3. the credentials in `METRICSD_CREDSTORE` (default `/etc/credstore`): `metricsd-jwt-secret`,
///    `metricsd-admin-token`, `metricsd-db-password`, when present and readable, are used as
///    `METRICSD_JWT_SECRET_FILE`, `METRICSD_ADMIN_TOKEN_FILE`, `METRICSD_DB_PASSWORD_FILE` (a credential wins
///    over the settings file, as under systemd), unless the environment sets that secret or its file itself.
public struct HostEnvironment: Sendable {
    public static let defaultEnvironmentFile = "/etc/metricsd/metricsd.env"
    public static let defaultCredentialStore = "/etc/credstore"

    /// A credential of the unit: its id (`$CREDENTIALS_DIRECTORY/<id>`), its file in the credential store, and
    /// the variables that name it outside systemd.
    public struct Credential: Sendable {
        public let id: String
        public let storeName: String
        public let fileVariable: String
        public let variable: String?
        /// False for the TLS certificate: it is public, only its key is secret.
        public var isSecret = true
    }

    public static let credentials: [Credential] = [
        Credential(
            id: "jwt-secret", storeName: "metricsd-jwt-secret", fileVariable: "METRICSD_JWT_SECRET_FILE",
            variable: "METRICSD_JWT_SECRET"),
        Credential(
            id: "admin-token", storeName: "metricsd-admin-token", fileVariable: "METRICSD_ADMIN_TOKEN_FILE",
            variable: "METRICSD_ADMIN_TOKEN"),
        Credential(
            id: "db-password", storeName: "metricsd-db-password", fileVariable: "METRICSD_DB_PASSWORD_FILE",
            variable: nil),
        Credential(
            id: "tls-certificate", storeName: "metricsd-tls-certificate", fileVariable: "METRICSD_TLS_CERTIFICATE_FILE",
            variable: nil, isSecret: false),
        Credential(id: "tls-key", storeName: "metricsd-tls-key", fileVariable: "METRICSD_TLS_KEY_FILE", variable: nil),
    ]

    /// The environment to configure from.
    public let environment: [String: String]
    /// True when systemd started the process (nothing was read).
    public let underSystemd: Bool
    /// The settings file read, if any, and the settings taken from it (those the environment did not set).
    public let settingsFile: String?
    public let settingsFromFile: [String]
    /// Credential files used (`id` → path).
    public let credentialsUsed: [(id: String, path: String)]
    /// Credential files present but not readable by this user (e.g. not root), with the reason.
    public let credentialsUnreadable: [(path: String, reason: String)]

    public static func isUnderSystemd(_ environment: [String: String]) -> Bool {
        !(environment["INVOCATION_ID"] ?? "").isEmpty || !(environment["CREDENTIALS_DIRECTORY"] ?? "").isEmpty
    }

    /// Reads the settings file and credentials for `base` (the process environment).
    public init(_ base: [String: String]) throws(ConfigurationError) {
        guard !Self.isUnderSystemd(base) else {
            self.environment = base
            self.underSystemd = true
            self.settingsFile = nil
            self.settingsFromFile = []
            self.credentialsUsed = []
            self.credentialsUnreadable = []
            return
        }
        self.underSystemd = false
        var environment = base
        // Optional when not named, or named with a leading "-" (as in EnvironmentFile=); required otherwise.
        var explicitFile = base["METRICSD_ENV_FILE"].flatMap { $0.isEmpty ? nil : $0 }
        var required = explicitFile != nil
        if let named = explicitFile, named.hasPrefix("-") {
            explicitFile = String(named.dropFirst())
            required = false
        }
        let file = explicitFile ?? Self.defaultEnvironmentFile
        var fromFile: [String] = []
        if required || FileManager.default.fileExists(atPath: file) {
            for assignment in try EnvironmentFile.read(file) where base[assignment.name] == nil {
                environment[assignment.name] = assignment.value
                if !fromFile.contains(assignment.name) { fromFile.append(assignment.name) }
            }
            self.settingsFile = file
        } else {
            self.settingsFile = nil
        }
        self.settingsFromFile = fromFile
        if environment["METRICSD_CONFIG_FILE"] == nil {
            environment["METRICSD_CONFIG_FILE"] = "-" + Self.directory(of: file) + "/metricsd.conf"
        }

        let store = base["METRICSD_CREDSTORE"].flatMap { $0.isEmpty ? nil : $0 } ?? Self.defaultCredentialStore
        var used: [(id: String, path: String)] = []
        var unreadable: [(path: String, reason: String)] = []
        for credential in Self.credentials {
            let explicit = [credential.fileVariable, credential.variable].compactMap { $0 }
                .contains { !(base[$0] ?? "").isEmpty }
            let path = store + "/" + credential.storeName
            guard !explicit, FileManager.default.fileExists(atPath: path) else { continue }
            if access(path, R_OK) == 0 {
                environment[credential.fileVariable] = path
                used.append((credential.id, path))
            } else {
                unreadable.append((path, String(cString: strerror(errno)).lowercased()))
            }
        }
        self.credentialsUsed = used
        self.credentialsUnreadable = unreadable
        self.environment = environment
    }

    /// Where a setting's value came from, in words for an error message: `environment` is the process
    /// environment, `merged` the configuration read from it (this host environment with `METRICSD_CONFIG_FILE`
    /// on top).
    public func origin(of name: String, environment: [String: String], merged: [String: String]) -> String {
        if merged[name] != nil, merged[name] != self.environment[name] {
            return "from METRICSD_CONFIG_FILE (\(self.environment["METRICSD_CONFIG_FILE"] ?? "?"))"
        }
        if self.settingsFromFile.contains(name), let file = self.settingsFile {
            return "from \(file)"
        }
        if environment[name] != nil {
            return self.underSystemd ? "from the unit's environment" : "from the environment"
        }
        let file = self.settingsFile ?? "\(Self.defaultEnvironmentFile), which does not exist here"
        return "not set in the environment nor in \(file)"
    }

    /// The directory part of a path ("" for a bare name, "/" for a file at the root), as Foundation's
    /// `deletingLastPathComponent` gives it.
    package static func directory(of path: String) -> String {
        var path = Substring(path)
        while path.count > 1, path.hasSuffix("/") { path.removeLast() }
        guard let slash = path.lastIndex(of: "/") else { return "" }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }
}
