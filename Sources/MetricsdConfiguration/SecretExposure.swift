import Glibc
import MetricsdMasking

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Secrets that other local users (or every program metricsd starts) can read: one warning each, naming the
/// variable and saying where the secret belongs. `check-config` prints them and `serve` logs them at start-up;
/// neither refuses to run, since the secret works — it is only exposed.
///
/// A secret is exposed when it comes from
/// - a plain environment variable (`METRICSD_JWT_SECRET`, `METRICSD_ADMIN_TOKEN`, `PGPASSWORD`, a password inside
///   `DATABASE_URL`): under systemd `Environment=` lines are shown to every local user by `systemctl show`, an
///   `EnvironmentFile=` such as `/etc/metricsd/metricsd.env` is installed 0644, and every child process inherits
///   the environment;
/// - a file every local user may read (mode `o+r`), named by `METRICSD_JWT_SECRET_FILE`,
///   `METRICSD_ADMIN_TOKEN_FILE` or `METRICSD_DB_PASSWORD_FILE`, or found in the credential store.
///
/// A secret from the unit's credentials (`$CREDENTIALS_DIRECTORY`, filled by `LoadCredential=` from
/// `/etc/credstore/`, readable by the service alone) is not.
public enum SecretExposure {
    /// One exposed secret.
    public struct Warning: Sendable, Equatable, CustomStringConvertible {
        /// The variable the secret comes from (`METRICSD_JWT_SECRET`, `DATABASE_URL`, `METRICSD_DB_PASSWORD_FILE` …).
        public let setting: String
        /// What is wrong and where the secret belongs, one line.
        public let text: String
        public var description: String { "\(self.setting): \(self.text)" }

        package init(setting: String, text: String) {
            self.setting = setting
            self.text = text
        }
    }

    /// The connection-string settings whose passwords count as plain environment variables.
    public static let connectionStringSettings = ["DATABASE_URL", "METRICSD_READ_DATABASE_URL"]

    /// The warnings for `environment` (the configuration as `serve` reads it).
    /// - Parameters:
    ///   - settingsFile: the settings file read outside systemd, and the names taken from it.
    ///   - underSystemd: whether systemd started the process (`Environment=`/`EnvironmentFile=` then).
    public static func warnings(
        environment: [String: String], settingsFile: String? = nil, settingsFromFile: [String] = [],
        underSystemd: Bool
    ) -> [Warning] {
        let origin = Origin(settingsFile: settingsFile, settingsFromFile: settingsFromFile, underSystemd: underSystemd)
        var warnings: [Warning] = []
        let credentialsDirectory = environment["CREDENTIALS_DIRECTORY"].flatMap { $0.isEmpty ? nil : $0 }
        for credential in HostEnvironment.credentials where credential.isSecret {
            let home =
                "/etc/credstore/\(credential.storeName) (root:root, 0600), which the unit passes as the credential \(credential.id) (LoadCredential=)"
            if let variable = credential.variable, let value = environment[variable], !value.isEmpty {
                warnings.append(
                    Warning(
                        setting: variable,
                        text: "the secret \(origin.describe(variable)); put it in \(home), and remove the variable"))
            }
            if let directory = credentialsDirectory,
                FileManager.default.fileExists(atPath: directory + "/" + credential.id)
            {
                continue  // the credential is used; a *_FILE is not read
            }
            if let path = environment[credential.fileVariable], !path.isEmpty, let mode = Self.worldReadableMode(path) {
                warnings.append(
                    Warning(
                        setting: credential.fileVariable,
                        text:
                            "\(path) is readable by every local user (mode \(mode)): make it root:root 0600 (chmod 0600), or move the secret to \(home)"
                    ))
            }
        }
        for setting in Self.connectionStringSettings {
            guard let url = environment[setting], !url.isEmpty, !ConnectionStringPasswords.find(in: url).isEmpty else {
                continue
            }
            warnings.append(
                Warning(
                    setting: setting,
                    text:
                        "holds a password and \(origin.describe(setting)); leave the password out of it and put it in \(Self.passwordHome)"
                ))
        }
        if let password = environment["PGPASSWORD"], !password.isEmpty {
            warnings.append(
                Warning(
                    setting: "PGPASSWORD",
                    text:
                        "the password \(origin.describe("PGPASSWORD")); put it in \(Self.passwordHome), and remove the variable"
                ))
        }
        return warnings
    }

    static let passwordHome =
        "/etc/credstore/metricsd-db-password (root:root, 0600), which the unit passes as the credential db-password (its LoadCredential=db-password line)"

    /// `0644` when every local user may read `path` (other-readable), nil when not or when it cannot be examined.
    static func worldReadableMode(_ path: String) -> String? {
        var status = stat()
        guard stat(path, &status) == 0, status.st_mode & S_IROTH != 0 else { return nil }
        return "0" + String(status.st_mode & 0o7777, radix: 8)
    }

    /// Where a variable's value came from, in words.
    struct Origin {
        let settingsFile: String?
        let settingsFromFile: [String]
        let underSystemd: Bool

        func describe(_ variable: String) -> String {
            if let file = self.settingsFile, self.settingsFromFile.contains(variable) {
                let readable =
                    SecretExposure.worldReadableMode(file).map { ", which every local user can read (mode \($0))" }
                    ?? ""
                return "is set in \(file)\(readable)"
            }
            if self.underSystemd {
                return
                    "is a plain environment variable (systemctl show shows Environment= to every local user, /etc/metricsd/metricsd.env is world-readable, and every child process inherits it)"
            }
            return "is a plain environment variable (every program started from this environment inherits it)"
        }
    }
}
