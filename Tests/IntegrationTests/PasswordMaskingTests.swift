import Foundation
import Glibc
import HTTPTypes
import HummingbirdTesting
import MetricsdPostgres
import MetricsdTestSupport
import NIOPosix
import Testing

/// A password in the database settings is never printed back: not by `metricsd migrate`, `check-config` or
/// `serve` (stderr, the log and `STATUS=`, which `systemctl status` shows every local user), whatever libpq's
/// message quotes of a URL it refuses, and not when a real server refuses the password.
@Suite struct PasswordMaskingTests {
    /// A URL libpq (or metricsd's own check) refuses, the password in it, and what the message says instead.
    struct Malformed: Sendable, CustomStringConvertible {
        let name: String
        let url: String
        let password: String
        /// Text the one-line error must contain (with `***` where the password was quoted).
        let shows: String
        var description: String { self.name }
    }

    static let malformed: [Malformed] = [
        Malformed(
            name: "unclosed IPv6 bracket", url: "postgresql://masked:Br4cketLeakPw@[::1:5432/masked",
            password: "Br4cketLeakPw",
            shows: #"in IPv6 host address in URI: "postgresql://masked:***@[::1:5432/masked""#),
        Malformed(
            name: "bad percent-escape", url: "postgresql://masked:Wd3%zzEscapePw@127.0.0.1:5432/masked",
            password: "Wd3%zzEscapePw",
            shows: #"invalid percent-encoded token: "***""#),
        Malformed(
            name: "bad percent-escape in a password parameter",
            url: "postgresql://masked@127.0.0.1:5432/masked?password=Qu3ry%zzLeakPw", password: "Qu3ry%zzLeakPw",
            shows: #"invalid percent-encoded token: "***""#),
        Malformed(
            name: "unescaped @ in the password",
            url: "postgresql://masked:Xx@Yt9AtSignPw@127.0.0.1:5432/masked?connect_timeout=3",
            password: "Xx@Yt9AtSignPw", shows: #"could not translate host name "***@127.0.0.1""#),
        Malformed(
            name: "unescaped / in the password", url: "postgresql://masked:ab/cdSlashLeakPw@127.0.0.1:5432/masked",
            password: "ab/cdSlashLeakPw", shows: "port '***' is not a port number"),
        Malformed(
            name: "bad port", url: "postgresql://masked:P0rtLeakPw@127.0.0.1:5x5/masked", password: "P0rtLeakPw",
            shows: "port '5x5' is not a port number"),
        Malformed(
            name: "unknown parameter", url: "postgresql://masked:UnknownParamPw@127.0.0.1:5432/masked?sslmod=disable",
            password: "UnknownParamPw", shows: #"invalid URI query parameter: "sslmod""#),
        Malformed(
            name: "unknown keyword",
            url: "host=127.0.0.1 port=5432 user=masked password=Kw0rdLeakPw dbname=masked bogus=1",
            password: "Kw0rdLeakPw", shows: #"invalid connection option "bogus""#),
    ]

    /// Fails when `text` holds `password` or any piece of it of three characters or more (libpq quotes pieces).
    static func expectNoLeak(
        _ text: String, of password: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let separators: Set<Character> = ["@", ":", "/", "?", "#", "&", "=", "%", "[", "]"]
        let pieces: [String] = password.split(whereSeparator: { separators.contains($0) }).map(String.init).filter {
            $0.count >= 3
        }
        for secret in [password] + pieces {
            #expect(!text.contains(secret), "\(what) shows \(secret):\n\(text)", sourceLocation: sourceLocation)
        }
    }

    // MARK: URLs libpq refuses

    @Test(arguments: Self.malformed)
    func migrateAndCheckConfigShowNoPasswordOfARefusedURL(_ malformed: Malformed) async throws {
        let migrate = try await CommandLineTests.metricsd(["migrate"], ["DATABASE_URL": malformed.url])
        #expect(migrate.status == 1, "\(migrate)")
        #expect(migrate.stderr.split(separator: "\n").count == 1, "\(migrate.stderr)")
        #expect(migrate.stderr.contains(malformed.shows), "\(migrate.stderr)")
        Self.expectNoLeak(migrate.stdout + migrate.stderr, of: malformed.password, "migrate")

        let files = try CommandLineTests.HostFiles(settings: "DATABASE_URL=\(malformed.url)\n")
        let check = try await CommandLineTests.metricsd(
            ["check-config"],
            files.environment.merging(["METRICSD_LISTEN": "127.0.0.1:\(DaemonProcess.freePort())"]) { $1 })
        #expect(check.status == 78, "\(check)")
        #expect(
            check.stderr.contains("metricsd: DATABASE_URL: ") && check.stderr.contains(malformed.shows),
            "\(check.stderr)")
        Self.expectNoLeak(check.stdout + check.stderr, of: malformed.password, "check-config")
    }

    /// `serve`: the one `Error:` line and `STATUS=failed: …` for a string refused at start; for one that parses
    /// but names a host that is not there, the log and `STATUS=waiting for database: …`.
    @Test(arguments: Self.malformed)
    func serveShowsNoPasswordOnStderrOrInStatus(_ malformed: Malformed) async throws {
        let manager = try NotifyRecorder(abstract: true)
        defer { manager.stop() }
        let port = DaemonProcess.freePort()
        let environment = DaemonProcess.environment(
            databaseURL: malformed.url, port: port, extra: ["NOTIFY_SOCKET": manager.address])
        let daemon = try DaemonProcess(environment: environment, port: port)
        let status = try #require(
            await manager.first(timeout: .seconds(20)) {
                $0.value("STATUS").map { $0.contains(malformed.shows) } ?? false
            },
            "no STATUS= showing \(malformed.shows):\n\(manager.transcript)\nlog:\n\(daemon.log)")
        if status.value("STATUS")?.hasPrefix("waiting for database: ") == true {
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
            #expect(daemon.log.contains("Waiting for database"), "\(daemon.log)")
        } else {
            #expect(
                status.value("STATUS")?.hasPrefix("failed: configuration error: DATABASE_URL is not valid: ") == true,
                "\(status)")
            #expect(await daemon.waitForExit(timeout: .seconds(10)) == 1, "\(daemon.log)")
            // Warnings (a password inside DATABASE_URL is one) may come first; the error is one line.
            let errors = daemon.log.split(separator: "\n").filter { $0.hasPrefix("Error: ") }
            #expect(errors.count == 1, "\(daemon.log)")
            #expect(
                errors.first?.hasPrefix("Error: configuration error: DATABASE_URL is not valid: ") == true,
                "\(daemon.log)")
            #expect(errors.first?.contains(malformed.shows) == true, "\(daemon.log)")
        }
        Self.expectNoLeak(daemon.log, of: malformed.password, "serve's output")
        Self.expectNoLeak(manager.transcript, of: malformed.password, "sd_notify")
    }

    // MARK: A settings line quoted back

    @Test func aMalformedSettingsLineIsQuotedWithoutItsSecret() async throws {
        let url = "postgresql://masked:Ch3ckConfigLeakPw@127.0.0.1:5432/masked"
        let secret = "jwt-secret-in-a-bad-line-0123456789abcdef"
        for (line, shows, password) in [
            (
                "DATABASE_URL \(url)", "got 'DATABASE_URL postgresql://masked:***@127.0.0.1:5432/masked'",
                "Ch3ckConfigLeakPw"
            ),
            ("METRICSD_JWT_SECRET \(secret)", "got 'METRICSD_JWT_SECRET ***'", secret),
            ("PGPASSWORD \"Pg Pass Leak\"", "got 'PGPASSWORD ***'", "Pg Pass Leak"),
            (
                "DATABASE_URL host=db password=KwLineLeakPw x=y", "'DATABASE_URL host' is not a variable name",
                "KwLineLeakPw"
            ),
        ] {
            let files = try CommandLineTests.HostFiles(settings: "METRICSD_WORKERS=1\n\(line)\n")
            let check = try await CommandLineTests.metricsd(["check-config"], files.environment)
            #expect(check.status == 78, "\(check)")
            #expect(
                check.stderr
                    == "metricsd: METRICSD_ENV_FILE: \(files.envFile):2: expected NAME=value, \(shows) [config.file_syntax]\n"
                    || check.stderr
                        == "metricsd: METRICSD_ENV_FILE: \(files.envFile):2: \(shows) (letters, digits and _, not starting with a digit) [config.file_syntax]\n",
                "\(check.stderr)")
            Self.expectNoLeak(check.stdout + check.stderr, of: password, "check-config")

            // serve reads the same file outside systemd: its one line and STATUS= too.
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            var environment = DaemonProcess.environment(
                databaseURL: "", port: DaemonProcess.freePort(), extra: ["NOTIFY_SOCKET": manager.address])
            environment["METRICSD_ENV_FILE"] = files.envFile
            environment["DATABASE_URL"] = nil
            let daemon = try DaemonProcess(environment: environment)
            #expect(await daemon.waitForExit(timeout: .seconds(10)) == 1, "\(daemon.log)")
            #expect(daemon.log.contains(shows), "\(daemon.log)")
            let fatal = await manager.first(timeout: .seconds(2)) { $0.value("ERRNO") != nil }
            #expect(fatal?.value("STATUS")?.contains(shows) == true, "\(manager.transcript)")
            Self.expectNoLeak(daemon.log + manager.transcript, of: password, "serve")
        }
    }

    // MARK: A real server refusing the password

    /// A private cluster whose pg_hba.conf demands SCRAM for the role `masked` (password `rightPassword`) over TCP.
    static func withPasswordCluster(_ body: (ThrowawayCluster) async throws -> Void) async throws {
        try await withThrowawayCluster("password-auth") { cluster in
            try await cluster.start()
            let admin = try ConnectionSettings(conninfo: cluster.url, environment: [:])
            try await TestDatabase.blocking.runIfActive {
                let connection = try PostgresConnection(settings: admin)
                try connection.execute("CREATE ROLE masked LOGIN PASSWORD '\(Self.rightPassword)'")
                try connection.execute("CREATE DATABASE masked OWNER masked")
            }
            let hba = cluster.directory + "/data/pg_hba.conf"
            let rules = try String(contentsOfFile: hba, encoding: .utf8)
            // First match wins: the role needs its password over TCP; everything else stays as it was (trust).
            try ("host all masked 127.0.0.1/32 scram-sha-256\n" + rules).write(
                toFile: hba, atomically: false, encoding: .utf8)
            try await TestDatabase.blocking.runIfActive {
                _ = try PostgresConnection(settings: admin).query("SELECT pg_reload_conf()")
            }
            try await body(cluster)
        }
    }

    static let rightPassword = "Right-Pw-0123456789"

    @Test func aServerThatRefusesThePasswordIsReportedWithoutIt() async throws {
        try await Self.withPasswordCluster { cluster in
            let wrong = "Wr0ngPw-Secret7"
            let url = "postgresql://masked:\(wrong)@127.0.0.1:\(cluster.port)/masked?sslmode=disable"
            let refused = "password authentication failed for user \"masked\""

            let migrate = try await CommandLineTests.metricsd(["migrate"], ["DATABASE_URL": url])
            #expect(migrate.status == 1, "\(migrate)")
            #expect(
                migrate.stderr.hasPrefix("Error: cannot connect to the database: ") && migrate.stderr.contains(refused),
                "\(migrate.stderr)")
            Self.expectNoLeak(migrate.stdout + migrate.stderr, of: wrong, "migrate")

            let files = try CommandLineTests.HostFiles(
                settings: "DATABASE_URL=\(url)\nMETRICSD_LISTEN=127.0.0.1:\(DaemonProcess.freePort())\n")
            let check = try await CommandLineTests.metricsd(["check-config"], files.environment)
            #expect(check.status == 78, "\(check)")
            #expect(
                check.stderr.contains("metricsd: DATABASE_URL: cannot connect to the database: ")
                    && check.stderr.contains(refused), "\(check.stderr)")
            #expect(check.stderr.contains("metricsd: warning: DATABASE_URL: holds a password"), "\(check.stderr)")
            Self.expectNoLeak(check.stdout + check.stderr, of: wrong, "check-config")

            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: url, port: port, extra: ["NOTIFY_SOCKET": manager.address]),
                port: port)
            let waiting = await manager.first(timeout: .seconds(20)) {
                $0.value("STATUS")?.hasPrefix("waiting for database: ") == true
            }
            #expect(waiting?.value("STATUS")?.contains(refused) == true, "\(manager.transcript)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
            // The log's waiting line carries libpq's reason too, whole (the text format writes the value's quotes
            // as \"), and, as everywhere, no password.
            let waitingLine = daemon.log.split(separator: "\n").first { $0.contains("Waiting for database") }
            #expect(
                waitingLine?.contains(#"password authentication failed for user \"masked\""#) == true, "\(daemon.log)")
            #expect(waitingLine?.contains("metricsd.error.code=database.connection_failed") == true, "\(daemon.log)")
            Self.expectNoLeak(daemon.log + manager.transcript, of: wrong, "serve")

            // The same URL with the right password (the credential's, which wins over the string's) works: the
            // server really checks passwords.
            let passwordFile = try scratchFile("db-password", Self.rightPassword + "\n")
            chmod(passwordFile, 0o600)
            let migrated = try await CommandLineTests.metricsd(
                ["migrate"], ["DATABASE_URL": url, "METRICSD_DB_PASSWORD_FILE": passwordFile])
            #expect(migrated.status == 0, "\(migrated)")
            #expect(migrated.stdout.contains("applied 0001_"), "\(migrated.stdout)")
        }
    }

    /// A running daemon whose password stops working: `/readyz`, the log and `STATUS=` say why, never the password.
    @Test func aPasswordRefusedAfterStartUpIsNotShownEither() async throws {
        try await Self.withPasswordCluster { cluster in
            let url = "postgresql://masked:\(Self.rightPassword)@127.0.0.1:\(cluster.port)/masked?sslmode=disable"
            let manager = try NotifyRecorder(abstract: true)
            defer { manager.stop() }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                arguments: ["serve", "--migrate"],
                environment: DaemonProcess.environment(
                    databaseURL: url, port: port,
                    extra: [
                        "NOTIFY_SOCKET": manager.address, "METRICSD_DB_SESSION_MAX_AGE": "1", "METRICSD_WORKERS": "0",
                    ]),
                port: port)
            try await daemon.waitUntilReady()
            #expect(daemon.log.contains("DATABASE_URL: holds a password"), "the start-up warning:\n\(daemon.log)")

            let admin = try ConnectionSettings(conninfo: cluster.url, environment: [:])
            try await TestDatabase.blocking.runIfActive {
                let connection = try PostgresConnection(settings: admin)
                try connection.execute("ALTER ROLE masked PASSWORD 'changed-by-the-dba'")
                _ = try connection.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'masked'")
            }
            let unready = await DaemonProcess.eventually(timeout: .seconds(20)) {
                (try? await daemon.request("/readyz"))?.status.code == 503
            }
            #expect(unready, "\(daemon.log)")
            let body = try await daemon.request("/readyz").text
            #expect(
                await DaemonProcess.eventually(timeout: .seconds(10)) {
                    daemon.log.contains("password authentication failed")
                }, "\(daemon.log)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
            Self.expectNoLeak(body + daemon.log + manager.transcript, of: Self.rightPassword, "serve")
        }
    }
}
