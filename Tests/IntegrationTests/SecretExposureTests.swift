import Foundation
import Glibc
import MetricsdCLI
import MetricsdConfiguration
import MetricsdTestSupport
import Testing

/// Secrets other local users can read — a plain environment variable, a world-readable settings or secret file,
/// a password inside DATABASE_URL — get one warning each, naming the variable and where the secret belongs, in
/// `check-config` (which still passes) and in the service's start-up log; secrets kept as 0600 credentials get none.
@Suite struct SecretExposureTests {
    static let credstoreAdvice =
        "/etc/credstore/metricsd-jwt-secret (root:root, 0600), which the unit passes as the credential jwt-secret (LoadCredential=)"

    /// The warning lines of `check-config`'s stderr.
    static func warnings(_ stderr: String) -> [String] {
        stderr.split(separator: "\n").map(String.init).filter { $0.hasPrefix("metricsd: warning: ") }
    }

    @Test func secretsInTheWorldReadableSettingsFileAreNamed() async throws {
        try await withTestDatabase { database in
            // Trust authentication: the password in the URL is never asked for, so the configuration works.
            let url = database.url.replacingOccurrences(
                of: "postgresql://postgres@", with: "postgresql://postgres:In-The-Url-Pw@")
            try #require(url != database.url)
            let files = try CommandLineTests.HostFiles(
                settings: """
                    DATABASE_URL=\(url)
                    METRICSD_LISTEN=127.0.0.1:\(DaemonProcess.freePort())
                    METRICSD_JWT_SECRET=\(String(repeating: "s", count: 40))
                    METRICSD_ADMIN_TOKEN=admin-token-in-the-file-0123
                    """,
                jwtSecret: nil, adminToken: nil)
            chmod(files.envFile, 0o644)
            let result = try await CommandLineTests.metricsd(["check-config"], files.environment)
            #expect(result.status == 0, "warnings do not fail the check: \(result)")
            let inFile = "is set in \(files.envFile), which every local user can read (mode 0644)"
            #expect(
                Self.warnings(result.stderr) == [
                    "metricsd: warning: METRICSD_JWT_SECRET: the secret \(inFile); put it in \(Self.credstoreAdvice), and remove the variable",
                    "metricsd: warning: METRICSD_ADMIN_TOKEN: the secret \(inFile); put it in /etc/credstore/metricsd-admin-token (root:root, 0600), which the unit passes as the credential admin-token (LoadCredential=), and remove the variable",
                    "metricsd: warning: DATABASE_URL: holds a password and \(inFile); leave the password out of it and put it in /etc/credstore/metricsd-db-password (root:root, 0600), which the unit passes as the credential db-password (its LoadCredential=db-password line)",
                ], "\(result.stderr)")
            #expect(result.stdout.hasPrefix("configuration OK (3 warnings)\n"), "\(result.stdout)")
            #expect(!(result.stdout + result.stderr).contains("In-The-Url-Pw"), "\(result)")
        }
    }

    @Test func exportedVariablesAndWorldReadableFilesAreNamed() async throws {
        let files = try CommandLineTests.HostFiles(
            settings: "METRICSD_LISTEN=127.0.0.1:\(DaemonProcess.freePort())\n", adminToken: nil)
        // The credential store's file made readable by everyone, and an exported admin token and PGPASSWORD.
        chmod(files.store + "/metricsd-jwt-secret", 0o644)
        let passwordFile = try scratchFile("db-password", "Db-File-Pw-0123\n")
        chmod(passwordFile, 0o604)
        let result = try await CommandLineTests.metricsd(
            ["check-config"],
            files.environment.merging([
                "METRICSD_ADMIN_TOKEN": "exported-admin-token-0123", "PGPASSWORD": "exported-pg-password",
                "METRICSD_DB_PASSWORD_FILE": passwordFile,
                "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1",
            ]) { $1 })
        let plain = "is a plain environment variable (every program started from this environment inherits it)"
        #expect(
            Self.warnings(result.stderr) == [
                "metricsd: warning: METRICSD_JWT_SECRET_FILE: \(files.store)/metricsd-jwt-secret is readable by every local user (mode 0644): make it root:root 0600 (chmod 0600), or move the secret to \(Self.credstoreAdvice)",
                "metricsd: warning: METRICSD_ADMIN_TOKEN: the secret \(plain); put it in /etc/credstore/metricsd-admin-token (root:root, 0600), which the unit passes as the credential admin-token (LoadCredential=), and remove the variable",
                "metricsd: warning: METRICSD_DB_PASSWORD_FILE: \(passwordFile) is readable by every local user (mode 0604): make it root:root 0600 (chmod 0600), or move the secret to /etc/credstore/metricsd-db-password (root:root, 0600), which the unit passes as the credential db-password (LoadCredential=)",
                "metricsd: warning: PGPASSWORD: the password \(plain); put it in /etc/credstore/metricsd-db-password (root:root, 0600), which the unit passes as the credential db-password (its LoadCredential=db-password line), and remove the variable",
            ], "\(result.stderr)")
        for secret in ["exported-admin-token-0123", "exported-pg-password", "Db-File-Pw-0123"] {
            #expect(!(result.stdout + result.stderr).contains(secret), "\(result)")
        }
    }

    /// Under systemd the unit's credentials are fine whatever their mode (systemd hands them to the service alone);
    /// a secret in the environment is named with systemd's words.
    @Test func underSystemdCredentialsAreFineTheEnvironmentIsNot() throws {
        let directory = try ScratchFiles.directory("credentials")
        try ScratchFiles.write(String(repeating: "c", count: 40), to: directory + "/jwt-secret")
        chmod(directory + "/jwt-secret", 0o644)
        let warnings = SecretExposure.warnings(
            environment: [
                "CREDENTIALS_DIRECTORY": directory, "METRICSD_JWT_SECRET_FILE": directory + "/jwt-secret",
                "METRICSD_ADMIN_TOKEN": "admin-token-from-environment",
                "DATABASE_URL": "host=db user=m password=kw-password",
            ],
            underSystemd: true)
        #expect(warnings.map(\.setting) == ["METRICSD_ADMIN_TOKEN", "DATABASE_URL"])
        #expect(
            warnings.allSatisfy {
                $0.text.contains(
                    "is a plain environment variable (systemctl show shows Environment= to every local user")
            })
        #expect(SecretExposure.warnings(environment: ["CREDENTIALS_DIRECTORY": directory], underSystemd: true).isEmpty)
        #expect(
            SecretExposure.warnings(
                environment: ["DATABASE_URL": "postgresql://m@db/m?sslmode=verify-full"], underSystemd: true
            ).isEmpty)
    }

    /// The service says the same at start-up, in its log (the journal under systemd), and serves anyway.
    @Test func serveLogsEachExposedSecretAtStartUp() async throws {
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            var environment = DaemonProcess.environment(databaseURL: database.url, port: port)
            environment["METRICSD_ADMIN_TOKEN_FILE"] = nil
            environment["METRICSD_ADMIN_TOKEN"] = "admin-token-from-environment"
            let daemon = try DaemonProcess(environment: environment, port: port)
            try await daemon.waitUntilReady()
            let lines = daemon.log.split(separator: "\n").filter { $0.contains("Secret readable by others") }
            #expect(lines.count == 1, "\(daemon.log)")
            #expect(
                lines.first?.contains(
                    " warning metricsd: Secret readable by others: METRICSD_ADMIN_TOKEN: the secret is a plain environment variable"
                ) == true,
                "\(daemon.log)")
            #expect(!daemon.log.contains("admin-token-from-environment"), "\(daemon.log)")
            await daemon.stop()
        }
    }
}
