import Foundation
import Glibc
import HTTPTypes
import HummingbirdTesting
import MetricsdCLI
import MetricsdConfiguration
import MetricsdHTTP
import MetricsdTestSupport
import Testing

/// Every HTTP connection and database session is a file descriptor. `serve` raises its soft `RLIMIT_NOFILE` to the
/// hard limit, refuses a configuration whose budget (connections + pool + listeners + reserve) does not fit, and
/// with the budget exactly at the limit it holds `METRICSD_MAX_CONNECTIONS` connections, keeps opening database
/// sessions, refuses one more connection at once (503, closed), and never runs out of descriptors. The child's limits are set with util-linux's `prlimit`.
@Suite struct DescriptorLimitTests {
    static let prlimit = "/usr/bin/prlimit"
    static let connections = 40

    /// The soft `Max open files` of a running process.
    static func softLimit(pid: Int32) -> Int? {
        let text = try? String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)
        let line = text?.split(separator: "\n").first { $0.hasPrefix("Max open files") }
        return line.flatMap { $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst(3).first }.flatMap {
            Int($0)
        }
    }

    static func openDescriptors(pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    @Test func connectionsUpToTheLimitAndOneMoreNeverExhaustDescriptors() async throws {
        try #require(
            FileManager.default.isExecutableFile(atPath: Self.prlimit), "\(Self.prlimit) is missing: install util-linux"
        )
        try await withTestDatabase { database in
            let extra = [
                "METRICSD_MAX_CONNECTIONS": "\(Self.connections)", "METRICSD_MAX_IN_FLIGHT": "\(Self.connections)",
                "METRICSD_DB_POOL_SIZE": "2",
                // Sessions replaced every second: new database sessions keep opening while every connection is taken.
                "METRICSD_DB_SESSION_MAX_AGE": "1",
            ]

            // 1. A hard limit the budget cannot fit: refused at start, in one line that states the budget.
            let refusedPort = DaemonProcess.freePort()
            let refused = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: refusedPort, extra: extra),
                port: refusedPort,
                launcher: [Self.prlimit, "--nofile=64:64", "--"])
            #expect(await refused.waitForExit(timeout: .seconds(20)) == 1, "\(refused.log)")
            let lines = refused.log.split(separator: "\n").map(String.init)
            let line = lines.first ?? ""
            #expect(
                lines.count == 1
                    && line.hasPrefix("Error: configuration error: METRICSD_MAX_CONNECTIONS=\(Self.connections) needs "),
                "\(refused.log)")
            let needed = try #require(
                line.firstMatch(of: /needs ([0-9]+) file descriptors/).flatMap { Int($0.1) }, "\(line)")
            #expect(
                needed == Self.connections + ConnectionLimit.lingeringRefusals + 2 + 1 + 1 + DescriptorBudget.reserve(),
                "\(line)")
            #expect(
                line.hasSuffix(
                    "the open-file limit (RLIMIT_NOFILE) is 64: raise the hard limit (LimitNOFILE= in the unit) [config.open_files]"
                ),
                "\(line)")

            // 2. Soft limit 64, hard limit exactly the budget: raised at start, and it serves.
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: port, extra: extra), port: port,
                launcher: [Self.prlimit, "--nofile=64:\(needed)", "--"])
            try await daemon.waitUntilReady()
            #expect(Self.softLimit(pid: daemon.pid) == needed, "the soft limit was not raised")

            // 3. Connections up to the limit, each answered once (so accepted and counted), kept open.
            var open: [RawConnection] = []
            for index in 0..<Self.connections {
                let connection = try RawConnection(port: port)
                connection.send(RawHTTP.get("/healthz", port: port))
                let answer = await connection.readResponse(timeout: .seconds(10))
                #expect(answer?.hasPrefix("HTTP/1.1 200") == true, "connection \(index): \(answer ?? "no answer")")
                open.append(connection)
            }
            // A request that needs a new database session, on one of them, while new sessions keep opening.
            try await Task.sleep(for: .seconds(3))
            open[0].send(RawHTTP.get("/readyz", port: port))
            let ready = await open[0].readResponse(timeout: .seconds(10))
            #expect(ready?.hasPrefix("HTTP/1.1 200") == true, "\(ready ?? "no answer")\n\(daemon.log.suffix(2000))")
            let atLimit = Self.openDescriptors(pid: daemon.pid)
            #expect(atLimit > Self.connections && atLimit <= needed)
            print(
                "descriptors: \(atLimit) open with \(Self.connections) connections held; budget and hard limit \(needed)"
            )

            // 4. One more, while the limit holds: accepted at once (it does not wait in the listen backlog),
            //    answered 503 and closed. Then, with one connection given back, a fresh client is served.
            let more = try RawConnection(port: port)
            more.send(RawHTTP.get("/healthz", port: port))
            var received: [UInt8] = []
            let closedAfter = await more.waitForClose(timeout: .seconds(2), received: &received)
            let refusal = String(decoding: received, as: UTF8.self)
            print(
                "at the limit: the extra connection was answered \(refusal.prefix(32).debugDescription) and closed after \(String(describing: closedAfter))"
            )
            #expect(closedAfter != nil, "the extra connection is still open after 2 s\n\(daemon.log.suffix(2000))")
            #expect(refusal.hasPrefix("HTTP/1.1 503"), "not refused with a 503: \(refusal.debugDescription)")
            #expect(RawHTTP.acceptQueueLength(port: port) == 0, "connections wait in the listen backlog")
            open.removeLast()
            // The server sees that close a moment later; until then a new client is still one too many.
            let served = await DaemonProcess.eventually(timeout: .seconds(5)) {
                (try? await daemon.request("/healthz").status.code) == 200
            }
            #expect(served, "a fresh client is not served once a connection is given back")

            open.removeAll()
            await daemon.stop()
            for marker in ["Too many open files", "EMFILE"] {
                #expect(!daemon.log.contains(marker), "\(marker) in:\n\(daemon.log)")
            }
        }
    }

    /// `check-config` reports the same budget: its summary line, or the problem when the hard limit is too small.
    @Test func checkConfigReportsTheBudget() async throws {
        try #require(
            FileManager.default.isExecutableFile(atPath: Self.prlimit), "\(Self.prlimit) is missing: install util-linux"
        )
        let environment = [
            "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin", "METRICSD_ENV_FILE": "/dev/null",
            "METRICSD_CREDSTORE": "/nonexistent",
            "METRICSD_JWT_SECRET_FILE": DaemonProcess.secrets.directory + "/jwt-secret",
            "METRICSD_LISTEN": "127.0.0.1:\(DaemonProcess.freePort())",
            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x?connect_timeout=1",
        ]
        let needed = 1024 + ConnectionLimit.lingeringRefusals + 8 + 1 + 1 + DescriptorBudget.reserve()
        let tight = try await Subprocess.capture(
            Self.prlimit, ["--nofile=1024:1024", "--", try DaemonProcess.binary(), "check-config"],
            environment: environment)
        #expect(tight.status == 78)
        #expect(
            tight.stderr.contains(
                "metricsd: METRICSD_MAX_CONNECTIONS: METRICSD_MAX_CONNECTIONS=1024 needs \(needed) file descriptors (1024 HTTP connections (METRICSD_MAX_CONNECTIONS) + \(ConnectionLimit.lingeringRefusals) refused connections finishing + 8 database pool (METRICSD_DB_POOL_SIZE) + 1 settings listener session + 1 listening socket + \(DescriptorBudget.reserve()) reserve), but the open-file limit (RLIMIT_NOFILE) is 1024: lower METRICSD_MAX_CONNECTIONS to \(1024 - (needed - 1024)) or less, or raise the hard limit (LimitNOFILE= in the unit) [config.open_files]\n"
            ),
            "\(tight.stderr)")

        let roomy = try await Subprocess.capture(
            Self.prlimit, ["--nofile=1024:4096", "--", try DaemonProcess.binary(), "check-config"],
            environment: environment)
        #expect(!roomy.stderr.contains("METRICSD_MAX_CONNECTIONS"), "\(roomy.stderr)")
        #expect(
            roomy.stdout.contains(
                "  open files:   \(needed) needed of 4096 (RLIMIT_NOFILE hard limit; serve raises its soft limit to it)"
            ), "\(roomy.stdout)")
    }
}
