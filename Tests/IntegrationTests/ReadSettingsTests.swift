import Foundation
import MetricsdCLI
import MetricsdConfiguration
import MetricsdTestSupport
import Testing

/// `METRICSD_READ_DATABASE_URL` and `METRICSD_READ_MAX_LAG_SECONDS` as an operator meets them when they are wrong,
/// and the warning for a `METRICSD_*` variable that is no setting. (Reads on real standbys: `StandbyReadTests`.)
@Suite struct ReadSettingsTests {
    @Test func aReadURLLibpqRefusesIsNamedWithoutItsPassword() async throws {
        let url = "postgresql://metricsd:Read%zzLeakPw@db2:5432,db3:5432/metricsd"
        let files = try CommandLineTests.HostFiles(settings: "METRICSD_READ_DATABASE_URL=\(url)\n")
        let check = try await CommandLineTests.metricsd(
            ["check-config"],
            files.environment.merging(["METRICSD_LISTEN": "127.0.0.1:\(DaemonProcess.freePort())"]) { $1 })
        #expect(check.status == 78, "\(check)")
        #expect(
            check.stderr.contains("metricsd: METRICSD_READ_DATABASE_URL: METRICSD_READ_DATABASE_URL is not valid: "),
            "\(check.stderr)")
        #expect(
            check.stderr.contains("metricsd: warning: METRICSD_READ_DATABASE_URL: holds a password"), "\(check.stderr)")
        PasswordMaskingTests.expectNoLeak(check.stdout + check.stderr, of: "Read%zzLeakPw", "check-config")

        let port = DaemonProcess.freePort()
        let daemon = try DaemonProcess(
            environment: DaemonProcess.environment(
                databaseURL: "postgresql://127.0.0.1:1/none", port: port, extra: ["METRICSD_READ_DATABASE_URL": url]),
            port: port)
        #expect(await daemon.waitForExit(timeout: .seconds(10)) == 1, "\(daemon.log)")
        let errors = daemon.log.split(separator: "\n").filter { $0.hasPrefix("Error: ") }
        #expect(errors.count == 1, "\(daemon.log)")
        #expect(
            errors.first?.hasPrefix("Error: configuration error: METRICSD_READ_DATABASE_URL is not valid: ") == true,
            "\(daemon.log)")
        PasswordMaskingTests.expectNoLeak(daemon.log, of: "Read%zzLeakPw", "serve")
    }

    @Test func anUnreachableReadServerIsNamedByItsHost() async throws {
        try await withTestDatabase { database in
            let files = try CommandLineTests.HostFiles(
                settings: """
                    DATABASE_URL=\(database.url)
                    METRICSD_LISTEN=127.0.0.1:\(DaemonProcess.freePort())
                    METRICSD_READ_DATABASE_URL=postgresql://metricsd:UnreachPw-0123@127.0.0.1:1/metricsd?connect_timeout=2

                    """)
            let check = try await CommandLineTests.metricsd(["check-config"], files.environment)
            #expect(check.status == 78, "\(check)")
            let problems = check.stderr.split(separator: "\n").filter { !$0.contains(": warning: ") }
            #expect(problems.count == 1, "\(check.stderr)")
            #expect(
                problems.first?.hasPrefix("metricsd: METRICSD_READ_DATABASE_URL: 127.0.0.1:1: cannot use it: ") == true,
                "\(check.stderr)")
            PasswordMaskingTests.expectNoLeak(check.stdout + check.stderr, of: "UnreachPw-0123", "check-config")
        }
    }

    @Test(arguments: ["0.5", "0", "3601", "soon"])
    func aBadLagBoundIsNamed(value: String) async throws {
        let files = try CommandLineTests.HostFiles(settings: "METRICSD_READ_MAX_LAG_SECONDS=\(value)\n")
        let check = try await CommandLineTests.metricsd(["check-config"], files.environment)
        #expect(check.status == 78, "\(check)")
        #expect(
            check.stderr.contains(
                "metricsd: METRICSD_READ_MAX_LAG_SECONDS: must be a number from 1 to 3600, got '\(value)'"),
            "\(check.stderr)")
        let base = ["METRICSD_JWT_SECRET": String(repeating: "j", count: 48), "METRICSD_READ_MAX_LAG_SECONDS": value]
        #expect(throws: ConfigurationError.self) { try Configuration(environment: base) }
        #expect(
            try Configuration(environment: ["METRICSD_JWT_SECRET": String(repeating: "j", count: 48)]).database
                .readMaxLag
                == .seconds(5))
    }

    /// A `METRICSD_*` variable that is no setting (a typo, or a setting of a newer build) is named at start and by
    /// check-config, with the nearest setting when it looks like a typo; the check still passes.
    @Test func unknownSettingsAreWarnedAbout() async throws {
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            let files = try CommandLineTests.HostFiles(
                settings: "DATABASE_URL=\(database.url)\nMETRICSD_LISTEN=127.0.0.1:\(port)\n")
            let unknown = ["METRICSD_READ_MAX_LAG": "3", "METRICSD_SHINY_FUTURE_FEATURE": "on"]
            let check = try await CommandLineTests.metricsd(["check-config"], files.environment.merging(unknown) { $1 })
            #expect(check.status == 0, "\(check)")
            #expect(
                check.stderr.split(separator: "\n").map(String.init) == [
                    "metricsd: warning: METRICSD_READ_MAX_LAG: not a setting of this build, ignored; did you mean METRICSD_READ_MAX_LAG_SECONDS?",
                    "metricsd: warning: METRICSD_SHINY_FUTURE_FEATURE: not a setting of this build, ignored (a setting of a newer metricsd?); `metricsd help` lists the settings",
                ], "\(check.stderr)")
            #expect(check.stdout.hasPrefix("configuration OK (2 warnings)"), "\(check.stdout)")

            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port, extra: unknown.merging(["METRICSD_WORKERS": "0"]) { $1 }),
                port: port)
            defer { daemon.signal(SIGKILL) }
            try await daemon.waitUntilReady()
            #expect(
                daemon.log.contains("Unknown setting: METRICSD_READ_MAX_LAG: not a setting of this build"),
                "\(daemon.log)")
            #expect(daemon.log.contains("Unknown setting: METRICSD_SHINY_FUTURE_FEATURE: "), "\(daemon.log)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
