import Foundation
import Glibc
import HTTPTypes
import HummingbirdTesting
import MetricsdTestSupport
import Testing

/// `metricsd healthcheck`: asks a running daemon's `/readyz`; exit 0 and "ready", or exit 1 with one line saying why.
@Suite struct HealthcheckTests {
    /// Runs `metricsd healthcheck --address 127.0.0.1:PORT` with an empty environment.
    static func healthcheck(port: Int) async throws -> (status: Int32, stdout: String, stderr: String) {
        try await Subprocess.capture(
            try DaemonProcess.binary(), ["healthcheck", "--address", "127.0.0.1:\(port)", "--timeout", "5"],
            environment: [:])
    }

    @Test func readyDaemonAnswersReady() async throws {
        try await withTestDatabase { database in
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: port), port: port)
            try await daemon.waitUntilReady()
            let result = try await Self.healthcheck(port: port)
            #expect(result.status == 0, "\(result)")
            #expect(result.stdout == "ready\n")
            #expect(result.stderr.isEmpty)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    @Test func nothingListeningIsNotReady() async throws {
        let port = DaemonProcess.freePort()
        let result = try await Self.healthcheck(port: port)
        #expect(result.status == 1)
        #expect(result.stdout.isEmpty)
        let lines = result.stderr.split(separator: "\n")
        #expect(
            lines.count == 1 && lines.first?.hasPrefix("not ready: 127.0.0.1:\(port): ") == true, "\(result.stderr)")
    }

    /// The daemon runs but its database is stopped: `/readyz` answers 503 and the healthcheck says why; once the
    /// database is back, ready again.
    @Test func stoppedDatabaseIsNotReady() async throws {
        try await withThrowawayCluster("health") { cluster in
            try await cluster.start()
            let migrated = try await Subprocess.run(
                try DaemonProcess.binary(), ["migrate"], environment: ["DATABASE_URL": cluster.url])
            try #require(migrated.status == 0, "\(migrated.output)")
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: cluster.url, port: port), port: port)
            try await daemon.waitUntilReady()
            #expect(try await Self.healthcheck(port: port).status == 0)

            try await cluster.stop()
            var last: (status: Int32, stdout: String, stderr: String)?
            let notReady = try await DaemonProcess.eventually(timeout: .seconds(20)) {
                last = try await Self.healthcheck(port: port)
                return last?.status == 1
            }
            #expect(notReady, "\(String(describing: last))")
            let lines = last?.stderr.split(separator: "\n") ?? []
            #expect(
                lines.count == 1 && lines.first?.hasPrefix("not ready: database unreachable: ") == true,
                "\(String(describing: last))")
            #expect(last?.stdout.isEmpty == true)
            #expect(try await daemon.request("/readyz").status.code == 503)

            try await cluster.start()
            let readyAgain = try await DaemonProcess.eventually(timeout: .seconds(20)) {
                try await Self.healthcheck(port: port).status == 0
            }
            #expect(readyAgain)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log)")
        }
    }
}
