import Foundation
import Glibc
import MetricsdCLI
import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP
import MetricsdTestSupport
import Testing

/// The `metricsd` binary as an operator meets it: unknown commands, help, version, bad numbers, the settings
/// file and credential store read by hand-run commands, `check-config`, and the generated documents.
@Suite struct CommandLineTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// Runs the binary with exactly `environment` (plus PATH), reading no file of this host: the settings file and
    /// credential store point into an empty directory unless the caller says otherwise.
    static func metricsd(_ arguments: [String], _ environment: [String: String] = [:]) async throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        var env = [
            "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
            "METRICSD_ENV_FILE": "/dev/null", "METRICSD_CREDSTORE": "/nonexistent",
        ]
        env.merge(environment) { $1 }
        return try await Subprocess.capture(try DaemonProcess.binary(), arguments, environment: env)
    }

    // MARK: Unknown commands, help, version, bad numbers

    @Test func unknownCommandIsAnErrorNamingItAndTheNearestCommand() async throws {
        let result = try await Self.metricsd(["stauts"])
        #expect(result.status == 64)
        #expect(result.stdout.isEmpty)
        let lines = result.stderr.split(separator: "\n")
        #expect(lines.first == "metricsd: unknown command 'stauts'. Did you mean 'status'?", "\(result.stderr)")
        #expect(
            lines.count == 2 && lines.last?.hasPrefix("Commands: serve, migrate, recompute-all,") == true,
            "\(result.stderr)")
        #expect(!result.stderr.contains("USAGE"), "not serve's usage")

        let far = try await Self.metricsd(["frobnicate"])
        #expect(far.status == 64)
        #expect(far.stderr.hasPrefix("metricsd: unknown command 'frobnicate'.\nCommands: "), "\(far.stderr)")

        let help = try await Self.metricsd(["help", "chek-config"])
        #expect(help.status == 64)
        #expect(
            help.stderr.hasPrefix("metricsd: unknown command 'chek-config'. Did you mean 'check-config'?"),
            "\(help.stderr)")
    }

    @Test func helpListsEveryEnvironmentVariableAndFile() async throws {
        for arguments in [["help"], ["--help"], ["serve", "--help"], ["help", "check-config"]] {
            let result = try await Self.metricsd(arguments)
            #expect(result.status == 0, "\(arguments): \(result.stderr)")
            for setting in SettingsCatalog.all {
                #expect(
                    result.stdout.contains("  \(setting.name) (default: \(setting.defaultText)"),
                    "\(arguments): \(setting.name)")
            }
            for path in [
                "/etc/metricsd/metricsd.env", "/etc/credstore/metricsd-jwt-secret",
                "/etc/credstore/metricsd-admin-token",
            ] {
                #expect(result.stdout.contains(path), "\(arguments): \(path)")
            }
            #expect(result.stdout.contains("See man 8 metricsd."), "\(arguments)")
            #expect(!result.stdout.contains("README"), "\(arguments)")
        }
        let root = try await Self.metricsd(["help"])
        #expect(root.stdout.contains("check-config"))
        #expect(root.stdout.contains("EXIT CODES:\n  0   success"))

        let status = try await Self.metricsd(["status", "--help"])
        #expect(status.status == 0)
        #expect(status.stdout.contains("USAGE: metricsd status"))
        for name in ["DATABASE_URL", "METRICSD_DB_PASSWORD_FILE", "METRICSD_ENV_FILE", "METRICSD_CREDSTORE"] {
            #expect(status.stdout.contains("  \(name) (default: "), "\(name)")
        }
        #expect(status.stdout.contains("See man 8 metricsd."))
    }

    @Test func versionPrintsVersionFormulaAndBuild() async throws {
        let result = try await Self.metricsd(["--version"])
        #expect(result.status == 0)
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 4, "\(result.stdout)")
        #expect(lines.first == "metricsd \(BuildInfo.version)")
        #expect(lines.dropFirst().first == "formula version 1")
        let commit = lines.count > 2 ? lines[2] : ""
        #expect(commit == "commit unknown" || commit.wholeMatch(of: /commit [0-9a-f]{12}(-dirty)?/) != nil, "\(commit)")
        #expect(
            lines.last?.wholeMatch(of: /built with Swift 6\.[0-9]+( or later)? for [a-z0-9_]+-linux/) != nil,
            "\(lines.last ?? "")")
    }

    @Test(arguments: [
        (["skipped", "--limit", "-1"], "--limit must be a whole number from 1 to 10000000, got -1"),
        (["skipped", "--limit", "abc"], "--limit must be a whole number from 1 to 10000000, got abc"),
        (["skipped", "--limit", "0"], "--limit must be a whole number from 1 to 10000000, got 0"),
        (["skipped", "--limit", "10000001"], "--limit must be a whole number from 1 to 10000000, got 10000001"),
        (["healthcheck", "--timeout", "-1"], "--timeout must be a number of seconds from 0.1 to 300, got -1"),
        (["healthcheck", "--timeout", "soon"], "--timeout must be a number of seconds from 0.1 to 300, got soon"),
    ])
    func badNumbersGetAClearMessage(arguments: [String], message: String) async throws {
        let result = try await Self.metricsd(arguments)
        #expect(result.status == 64, "\(result)")
        #expect(result.stderr.split(separator: "\n").first.map(String.init) == "Error: \(message)", "\(result.stderr)")
    }

    // MARK: The settings file and the credential store

    /// A settings file and a credential store in a scratch directory, like /etc/metricsd and /etc/credstore.
    struct HostFiles {
        let directory: String
        var envFile: String { self.directory + "/metricsd.env" }
        var store: String { self.directory + "/credstore" }
        var environment: [String: String] { ["METRICSD_ENV_FILE": self.envFile, "METRICSD_CREDSTORE": self.store] }

        init(
            settings: String, jwtSecret: String? = String(repeating: "j", count: 48),
            adminToken: String? = "admin-token-0123456789"
        ) throws {
            self.directory = try ScratchFiles.directory("host")
            try FileManager.default.createDirectory(
                atPath: self.directory + "/credstore", withIntermediateDirectories: true)
            try ScratchFiles.write(settings, to: self.directory + "/metricsd.env")
            // Credentials as the README installs them: readable by their owner only.
            if let jwtSecret {
                try ScratchFiles.write(
                    jwtSecret + "\n", to: self.directory + "/credstore/metricsd-jwt-secret", mode: 0o600)
            }
            if let adminToken {
                try ScratchFiles.write(
                    adminToken + "\n", to: self.directory + "/credstore/metricsd-admin-token", mode: 0o600)
            }
        }
    }

    /// `metricsd status` with nothing exported but the two paths reads DATABASE_URL from the settings file; an
    /// exported DATABASE_URL wins; a bad line stops it with file:line.
    @Test func handRunCommandsReadTheSettingsFile() async throws {
        try await withTestDatabase { database in
            let files = try HostFiles(
                settings: "# metricsd\nDATABASE_URL=\"\(database.url)\"\nMETRICSD_DAILY_AT=00:07\n")
            let status = try await Self.metricsd(["status"], files.environment)
            #expect(status.status == 0, "\(status.stderr)")
            #expect(status.stdout.contains("00:07"), "\(status.stdout)")

            let overridden = try await Self.metricsd(
                ["status"],
                files.environment.merging(["DATABASE_URL": "postgresql://127.0.0.1:1/none?connect_timeout=2"]) { $1 })
            #expect(overridden.status == 1)
            #expect(overridden.stderr.hasPrefix("Error: cannot connect to the database: "), "\(overridden.stderr)")
            #expect(overridden.stderr.hasSuffix(" [database.connection_failed]\n"), "\(overridden.stderr)")
            // The error says which DATABASE_URL was used and where it came from: here the exported one wins.
            #expect(overridden.stderr.contains("DATABASE_URL is from the environment"), "\(overridden.stderr)")
            try ScratchFiles.write("DATABASE_URL=postgresql://127.0.0.1:1/none?connect_timeout=2\n", to: files.envFile)
            let fromFile = try await Self.metricsd(["status"], files.environment)
            #expect(fromFile.status == 1)
            #expect(fromFile.stderr.contains("DATABASE_URL is from \(files.envFile):"), "\(fromFile.stderr)")

            try ScratchFiles.write("DATABASE_URL=\(database.url)\nMETRICSD_WORKERS 3\n", to: files.envFile)
            let bad = try await Self.metricsd(["status"], files.environment)
            #expect(bad.status == 1)
            #expect(
                bad.stderr
                    == "Error: configuration error: \(files.envFile):2: expected NAME=value, got 'METRICSD_WORKERS 3' [config.file_syntax]\n",
                "\(bad.stderr)")
        }
    }

    /// `metricsd healthcheck` with nothing but the settings file asks METRICSD_LISTEN from it.
    @Test func healthcheckUsesTheListenerFromTheSettingsFile() async throws {
        let port = DaemonProcess.freePort()
        let files = try HostFiles(settings: "METRICSD_LISTEN=127.0.0.1:\(port)\n")
        let result = try await Self.metricsd(["healthcheck", "--timeout", "2"], files.environment)
        #expect(result.status == 1)
        #expect(result.stderr.hasPrefix("not ready: 127.0.0.1:\(port): "), "\(result.stderr)")
    }

    // MARK: check-config

    @Test func checkConfigAcceptsAGoodConfiguration() async throws {
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            let files = try HostFiles(
                settings: "DATABASE_URL=\(database.url)\nMETRICSD_LISTEN=127.0.0.1:\(port)\nMETRICSD_WORKERS=4\n")
            let result = try await Self.metricsd(["check-config"], files.environment)
            #expect(result.status == 0, "\(result)")
            #expect(result.stderr.isEmpty, "\(result.stderr)")
            let lines = result.stdout.split(separator: "\n").map(String.init)
            #expect(lines.first == "configuration OK", "\(result.stdout)")
            #expect(lines.contains("  listen:       127.0.0.1:\(port) (free)"), "\(result.stdout)")
            #expect(
                lines.contains { $0.hasPrefix("  database:     ") && $0.contains("schema current") }, "\(result.stdout)"
            )
            #expect(lines.contains("  tokens:       HS256 secret (48 bytes)"), "\(result.stdout)")
            #expect(lines.contains("  admin token:  set (22 characters)"), "\(result.stdout)")
            #expect(
                lines.contains("  settings:     \(files.envFile) (3 settings; exported variables win)"),
                "\(result.stdout)")
        }
    }

    @Test func checkConfigNamesEveryProblemInOneLine() async throws {
        try await withTestDatabase { database in
            // The schema one migration behind.
            try await database.execute(
                "DELETE FROM metricsd_migrations WHERE name = (SELECT max(name) FROM metricsd_migrations)")
            // The metrics listener taken by another program.
            let busy = DaemonProcess.freePort()
            let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(socket) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = in_port_t(UInt16(busy).bigEndian)
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            try #require(bound == 0 && listen(socket, 1) == 0)

            let files = try HostFiles(
                settings: """
                    DATABASE_URL=\(database.url)
                    METRICSD_LISTEN=127.0.0.1:\(DaemonProcess.freePort())
                    METRICSD_INTERNAL_LISTEN=127.0.0.1:\(busy)
                    METRICSD_DB_POOL_SIZE=0
                    METRICSD_DAILY_AT=25:00
                    METRICSD_LOG_LEVEL=loud
                    """,
                jwtSecret: "too-short", adminToken: "short")
            let result = try await Self.metricsd(["check-config"], files.environment)
            #expect(result.status == 78, "\(result)")
            let problems = result.stderr.split(separator: "\n").map(String.init)
            let expected = [
                "metricsd: METRICSD_DB_POOL_SIZE: must be a whole number from 1 to 200, got '0' [config.invalid_value]",
                "metricsd: METRICSD_DAILY_AT: must be HH:MM (e.g. 00:05), got '25:00' [config.invalid_value]",
                "metricsd: METRICSD_LOG_LEVEL: must be one of trace, debug, info, notice, warning, error, critical, got 'loud' [config.invalid_value]",
                "metricsd: METRICSD_JWT_SECRET_FILE: the JWT secret is 9 bytes; HS256 needs at least 32 (e.g. openssl rand -base64 48) [config.jwt_secret_too_short]",
                "metricsd: METRICSD_ADMIN_TOKEN_FILE: the admin token is 5 characters; at least 16 are needed [config.admin_token_too_short]",
                "metricsd: METRICSD_INTERNAL_LISTEN: 127.0.0.1:\(busy) is in use by another program [config.listen_unavailable]",
            ]
            #expect(Array(problems.prefix(6)) == expected, "\(result.stderr)")
            #expect(problems.count == 7, "\(result.stderr)")
            #expect(
                problems.last?.wholeMatch(
                    of:
                        /metricsd: DATABASE_URL: .+: schema is behind, 1 of [0-9]+ migrations pending \(run: metricsd migrate\) \[schema\.behind\]/
                )
                    != nil, "\(result.stderr)")
            #expect(result.stdout.hasPrefix("configuration has 7 problems\n"), "\(result.stdout)")

        }
    }

    /// The settings of the front door and the read servers fail with their own codes: TLS on without a certificate,
    /// a certificate that is not PEM, and a read-server URL libpq refuses.
    @Test func checkConfigNamesTLSAndReadServerProblemsByCode() async throws {
        try await withTestDatabase { database in
            let base = "DATABASE_URL=\(database.url)\nMETRICSD_LISTEN=127.0.0.1:\(DaemonProcess.freePort())\n"
            let notPEM = try ScratchFiles.directory("not-pem") + "/tls.pem"
            try ScratchFiles.write("not a certificate\n", to: notPEM, mode: 0o600)
            let cases: [(settings: String, setting: String, code: String)] = [
                ("METRICSD_TLS=public\n", "METRICSD_TLS", "config.tls_incomplete"),
                (
                    "METRICSD_TLS=public\nMETRICSD_TLS_CERTIFICATE_FILE=\(notPEM)\nMETRICSD_TLS_KEY_FILE=\(notPEM)\n",
                    "METRICSD_TLS",
                    "config.tls_certificate_invalid"
                ),
                (
                    "METRICSD_READ_DATABASE_URL=postgresql://127.0.0.1/metricsd?no_such_parameter=1\n",
                    "METRICSD_READ_DATABASE_URL",
                    "config.read_database_url_invalid"
                ),
            ]
            for (settings, setting, code) in cases {
                let files = try HostFiles(settings: base + settings)
                let result = try await Self.metricsd(["check-config"], files.environment)
                #expect(result.status == 78, "\(settings): \(result)")
                let problems = result.stderr.split(separator: "\n").filter { !$0.contains("warning") }
                #expect(problems.count == 1, "\(settings): \(result.stderr)")
                #expect(problems.first?.hasPrefix("metricsd: \(setting): ") == true, "\(settings): \(result.stderr)")
                #expect(problems.first?.hasSuffix(" [\(code)]") == true, "\(settings): \(result.stderr)")
            }
        }
    }

    /// METRICSD_RETENTION_DAYS: unset (or empty, like every setting) keeps every row; a value that is not a whole
    /// number of days from 0 to 36500 is named with what was given.
    @Test(arguments: ["-1", "30.5", "forever", "36501"])
    func aBadRetentionSettingIsNamed(value: String) async throws {
        let files = try HostFiles(settings: "METRICSD_RETENTION_DAYS=\(value)\n")
        let result = try await Self.metricsd(["check-config"], files.environment)
        #expect(result.status == 78, "\(result)")
        let problems = result.stderr.split(separator: "\n").map(String.init)
        #expect(
            problems.contains(
                "metricsd: METRICSD_RETENTION_DAYS: must be a whole number from 0 to 36500, got '\(value)' [config.invalid_value]"
            ),
            "\(result.stderr)")
    }

    @Test func retentionIsOffUnlessSet() throws {
        let base = ["DATABASE_URL": "postgresql:///metricsd", "METRICSD_JWT_SECRET": String(repeating: "j", count: 48)]
        #expect(try Configuration(environment: base).retentionDays == 0)
        #expect(try Configuration(environment: base.merging(["METRICSD_RETENTION_DAYS": ""]) { $1 }).retentionDays == 0)
        #expect(
            try Configuration(environment: base.merging(["METRICSD_RETENTION_DAYS": "0"]) { $1 }).retentionDays == 0)
        #expect(
            try Configuration(environment: base.merging(["METRICSD_RETENTION_DAYS": "400"]) { $1 }).retentionDays == 400
        )
    }

    @Test func checkConfigReportsAnUnreachableDatabaseAndAMissingSecret() async throws {
        let files = try HostFiles(
            settings: "DATABASE_URL=postgresql://metricsd@127.0.0.1:1/metricsd?connect_timeout=2\n", jwtSecret: nil)
        let result = try await Self.metricsd(
            ["check-config"],
            files.environment.merging(["METRICSD_LISTEN": "127.0.0.1:\(DaemonProcess.freePort())"]) { $1 })
        #expect(result.status == 78, "\(result)")
        let problems = result.stderr.split(separator: "\n").map(String.init)
        #expect(problems.count == 2, "\(result.stderr)")
        #expect(problems.first?.hasPrefix("metricsd: METRICSD_JWT_SECRET_FILE: ") == true, "\(result.stderr)")
        #expect(problems.first?.hasSuffix(" [config.no_jwt_key]") == true, "\(result.stderr)")
        #expect(
            problems.last?.hasPrefix("metricsd: DATABASE_URL: cannot connect to the database: ") == true,
            "\(result.stderr)")
        #expect(problems.last?.hasSuffix(" [database.connection_failed]") == true, "\(result.stderr)")
    }

    // MARK: Generated documents

    /// systemd/metricsd.env.example and systemd/debian/metricsd.8 are what the binary generates from the settings
    /// table: regenerate them with `metricsd generate-docs env-example|man` after changing a setting.
    @Test(arguments: [("env-example", "systemd/metricsd.env.example"), ("man", "systemd/debian/metricsd.8")])
    func committedDocumentsAreCurrent(document: String, path: String) async throws {
        let result = try await Self.metricsd(["generate-docs", document])
        #expect(result.status == 0, "\(result.stderr)")
        let committed = try String(contentsOf: Self.root.appendingPathComponent(path), encoding: .utf8)
        #expect(
            committed == result.stdout,
            "\(path) is stale: run .build/debug/metricsd generate-docs \(document) > \(path)")
    }

    /// Every operator setting is in metricsd.env.example, commented out at the catalog's default; the settings whose
    /// value is a secret are not (the file is world-readable), and the header says why.
    @Test func environmentExampleListsEverySettingWithItsDefault() throws {
        let text = try String(
            contentsOf: Self.root.appendingPathComponent("systemd/metricsd.env.example"), encoding: .utf8)
        let lines = Set(text.split(separator: "\n").map(String.init))
        for setting in SettingsCatalog.operatorSettings {
            #expect(lines.contains("#\(setting.name)=\(setting.defaultValue ?? "")"), "\(setting.name)")
        }
        #expect(SettingsCatalog.secretSettings.map(\.name) == ["METRICSD_JWT_SECRET", "METRICSD_ADMIN_TOKEN"])
        for setting in SettingsCatalog.secretSettings {
            #expect(!text.contains("#\(setting.name)="), "\(setting.name) offered in a world-readable file")
        }
        #expect(text.contains("# SECRETS DO NOT BELONG IN THIS FILE. It is installed 0644"))
        #expect(
            text.contains(
                "# So no password in DATABASE_URL, no PGPASSWORD, and not METRICSD_JWT_SECRET or METRICSD_ADMIN_TOKEN"))
        // And the file parses as a settings file (all commented out: no assignments).
        #expect(try EnvironmentFile.parse(text, path: "metricsd.env.example").isEmpty)
    }

    /// Every METRICSD_* variable named in the sources is in the settings table (so help, the man page and the
    /// example file cannot miss one), but for the names of metricsd's own scripts and tests that the unknown-setting
    /// warning leaves alone.
    @Test func everyVariableInTheSourcesIsInTheCatalog() throws {
        let sources = Self.root.appendingPathComponent("Sources")
        let files =
            FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL }
            .filter { $0.pathExtension == "swift" } ?? []
        #expect(files.count > 20)
        var names = Set<String>()
        for file in files {
            let text = try String(contentsOf: file, encoding: .utf8)
            for match in text.matches(of: /"(METRICSD_[A-Z0-9_]+)"/) { names.insert(String(match.1)) }
        }
        #expect(names.contains("METRICSD_LISTEN"))
        let catalog = Set(SettingsCatalog.all.map(\.name))
        let tooling = Set(SettingsCatalog.toolingPrefixes).union(SettingsCatalog.toolingNames)
        #expect(names.subtracting(catalog).subtracting(tooling).sorted() == [], "settings missing from SettingsCatalog")
    }
}
