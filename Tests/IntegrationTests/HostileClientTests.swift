import Foundation
import Glibc
import MetricsdTestSupport
import Testing

/// Clients that misbehave at the connection level, against the real daemon over raw sockets: each case asserts
/// its bound (the daemon's memory from `/proc/PID/status`, the time until the server closes, what else it still
/// answers meanwhile). Timeouts are short (request 1 s, idle 2 s, write 2 s) so the suite stays near a minute.
@Suite struct HostileClientTests {
    static let settings = [
        "METRICSD_HTTP_REQUEST_TIMEOUT_SECONDS": "1", "METRICSD_HTTP_IDLE_TIMEOUT_SECONDS": "2",
        "METRICSD_HTTP_WRITE_TIMEOUT_SECONDS": "2", "METRICSD_SHUTDOWN_SECONDS": "10",
    ]
    /// Memory one hostile connection may add to the daemon.
    static let memoryBoundKiB = 32 * 1024
    static let today = "/v1/profile/metrics/today"

    /// A daemon over a database with user 1 and a metrics row.
    static func withDaemon(extra: [String: String] = [:], _ body: (DaemonProcess, TestDatabase) async throws -> Void)
        async throws
    {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(user: 1, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            let daemon = try await DaemonProcess.start(database: database, extra: Self.settings.merging(extra) { $1 })
            // Warm up every path the cases use, so the baseline memory includes what any first request allocates.
            for path in ["/healthz", "/readyz", "/openapi.yaml", "/metrics"] { _ = try await daemon.send(path) }
            _ = try await daemon.send(Self.today, headers: TestTokens.bearer(TestTokens.user(1)))
            try await body(daemon, database)
            await daemon.stop()
        }
    }

    static func get(_ target: String, id: String? = nil, extra: String = "") -> String {
        "GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (id.map { "X-Request-Id: \($0)\r\n" } ?? "") + extra + "\r\n"
    }

    /// `/healthz` on a fresh connection answers 200 (within a few seconds: a liveness check, not a speed test).
    static func expectHealthy(
        _ daemon: DaemonProcess, _ context: String, sourceLocation: SourceLocation = #_sourceLocation
    ) async {
        guard let descriptor = RawHTTP.connect(port: daemon.port) else {
            Issue.record("\(context): cannot connect", sourceLocation: sourceLocation)
            return
        }
        _ = RawHTTP.send(descriptor, Self.get("/healthz"))
        let replies = await RawHTTP.readResponses([descriptor], timeout: .seconds(5))
        #expect(replies.first?.status == 200, "\(context): /healthz \(replies)", sourceLocation: sourceLocation)
    }

    /// Waits until the daemon holds no open connection on its port; how long it took, nil if some stay open.
    static func untilNoConnections(_ daemon: DaemonProcess, timeout: Duration) async -> Duration? {
        let started = ContinuousClock.now
        let closed = await DaemonProcess.eventually(timeout: timeout) {
            ProcessProbe.openServerConnections(port: daemon.port) == 0
        }
        return closed ? ContinuousClock.now - started : nil
    }

    // MARK: Pipelining without reading

    /// One client pipelines `GET /openapi.yaml` (44 KB replies) as fast as the server takes them and never reads.
    /// The server stops reading it once replies back up, so memory stays bounded; the client's replies time out
    /// (write timeout) and the connection is closed; other clients are served throughout.
    @Test func pipeliningClientThatNeverReadsIsBounded() async throws {
        try await Self.withDaemon { daemon, _ in
            let baseline = ProcessProbe.residentKiB(daemon.pid)
            let client = try HostileSocket(port: daemon.port, receiveBuffer: 4096)
            let request = Array(Self.get("/openapi.yaml").utf8)
            let burst = Array([[UInt8]](repeating: request, count: 64).joined())
            var sent = 0
            var peak = baseline
            let started = ContinuousClock.now
            var lastProgress = started
            while ContinuousClock.now - started < .seconds(4) {
                guard let accepted = client.sendNow(burst) else { break }
                sent += accepted
                if accepted > 0 { lastProgress = ContinuousClock.now }
                peak = max(peak, ProcessProbe.residentKiB(daemon.pid))
                if ContinuousClock.now - lastProgress > .milliseconds(1500) { break }  // the server stopped reading
                try await Task.sleep(for: .milliseconds(accepted == 0 ? 20 : 1))
            }
            await Self.expectHealthy(daemon, "while a client pipelines without reading")
            peak = max(peak, ProcessProbe.residentKiB(daemon.pid))
            #expect(
                peak - baseline <= Self.memoryBoundKiB,
                "RSS grew \((peak - baseline) / 1024) MB (\(sent) bytes of requests accepted)")
            // The write timeout closes it (2 s after its replies stopped moving).
            let closed = await Self.untilNoConnections(daemon, timeout: .seconds(8))
            #expect(closed != nil, "the server never closed a client that does not read its replies")
            client.close()
            await Self.expectHealthy(daemon, "after the client left")
        }
    }

    /// 128 clients ask for `/openapi.yaml` with `Connection: close` and never read: every connection is closed
    /// within 2 × the idle timeout, and a fresh client is answered meanwhile.
    @Test func clientsThatNeverReadAClosingReplyAreClosed() async throws {
        try await Self.withDaemon { daemon, _ in
            var clients: [HostileSocket] = []
            for _ in 0..<128 {
                let client = try HostileSocket(port: daemon.port, receiveBuffer: 2048)
                #expect(await client.send(Self.get("/openapi.yaml", extra: "Connection: close\r\n")))
                clients.append(client)
            }
            await Self.expectHealthy(daemon, "with 128 clients not reading")
            let closed = await Self.untilNoConnections(daemon, timeout: .seconds(4))
            #expect(
                closed != nil,
                "\(ProcessProbe.openServerConnections(port: daemon.port)) connections still open after 2 × the idle timeout"
            )
            for client in clients { client.close() }
        }
    }

    // MARK: Slow clients

    /// A head sent one byte a second (slowloris) and a body sent one byte a second are both cut at the request
    /// timeout (1 s), answered with nothing.
    @Test func slowHeadAndSlowBodyAreCutAtTheRequestTimeout() async throws {
        try await Self.withDaemon { daemon, _ in
            let token = TestTokens.user(1)
            async let slowloris = Self.trickle(
                port: daemon.port, prefix: "",
                rest: "GET \(Self.today) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\n\r\n")
            let body = #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#
            async let slowBody = Self.trickle(
                port: daemon.port,
                prefix: "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\n"
                    + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n",
                rest: body)
            for (name, outcome) in [("slowloris", try await slowloris), ("slow body", try await slowBody)] {
                let after = try #require(outcome.after, "\(name): not closed within 5 s")
                #expect(after <= .seconds(3), "\(name): closed after \(after)")
                #expect(
                    outcome.received.isEmpty,
                    "\(name): answered \(String(decoding: outcome.received, as: UTF8.self).prefix(100))")
            }
            await Self.expectHealthy(daemon, "after the slow clients")
        }
    }

    /// Sends `prefix` at once, then `rest` one byte a second; how long until the server closed, and what it sent.
    static func trickle(port: Int, prefix: String, rest: String) async throws -> (after: Duration?, received: [UInt8]) {
        let client = try HostileSocket(port: port)
        let started = ContinuousClock.now
        if !prefix.isEmpty { await client.send(prefix) }
        var received: [UInt8] = []
        for byte in rest.utf8 {
            let waitUntil = ContinuousClock.now + .seconds(1)
            while ContinuousClock.now < waitUntil {
                switch client.readNow() {
                case .closed: return (ContinuousClock.now - started, received)
                case .data(let bytes): received += bytes
                case .nothing: try await Task.sleep(for: .milliseconds(20))
                }
            }
            if client.sendNow([byte]) == nil { return (ContinuousClock.now - started, received) }
            if ContinuousClock.now - started > .seconds(5) { break }
        }
        return (nil, received)
    }

    /// A reader with a 2 KiB window taking 64 bytes every 100 ms would need over a minute for `/openapi.yaml`.
    /// The daemon lets go of it within its timeouts (2 s here): a reply NIO cannot hand to the kernel is cut at
    /// the write timeout, and one the kernel's send buffer took whole (44 KB on loopback) leaves the daemon at the
    /// idle timeout; the kernel then delivers what it holds and the FIN behind it, which is why this looks at the
    /// daemon's side of the connection (no longer ESTABLISHED) rather than at the client's end of input.
    @Test func slowReaderIsLetGoWithinTheTimeouts() async throws {
        try await Self.withDaemon { daemon, _ in
            let client = try HostileSocket(port: daemon.port, receiveBuffer: 2048)
            #expect(await client.send(Self.get("/openapi.yaml")))
            let (bytes, _) = await client.readUntilClosed(timeout: .seconds(3), chunk: 64, pause: .milliseconds(100))
            #expect(bytes.count < 40_000, "the reader was not slow: \(bytes.count) bytes in 3 s")
            let released = await Self.untilNoConnections(daemon, timeout: .seconds(3))
            #expect(
                released != nil,
                "the daemon still holds a slow reader 6 s after its request (\(bytes.count) bytes read)")
            client.close()
            await Self.expectHealthy(daemon, "after the slow reader")
        }
    }

    // MARK: Framing

    /// Three pipelined 44 KB replies and an acknowledgement with a 16 KiB body, then a half-close: every reply
    /// arrives whole and in order, then the server closes.
    @Test func halfCloseAfterLargeRequestsGetsEveryReply() async throws {
        try await Self.withDaemon { daemon, _ in
            let valid = #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#
            let body = valid + String(repeating: " ", count: 16 * 1024 - valid.utf8.count)
            let client = try HostileSocket(port: daemon.port)
            var text = (1...3).map { Self.get("/openapi.yaml", id: "o\($0)") }.joined()
            text +=
                "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: x\r\nX-Request-Id: a4\r\n"
                + "Authorization: Bearer \(TestTokens.user(1))\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body
            #expect(await client.send(text))
            client.shutdownWrite()
            let (replies, closed) = await client.readResponses(
                bodyless: [false, false, false, false], timeout: .seconds(10))
            #expect(replies.map { $0.headers["x-request-id"] ?? "" } == ["o1", "o2", "o3", "a4"], "\(replies)")
            #expect(replies.prefix(3).allSatisfy { $0.status == 200 && $0.body.count > 40_000 })
            // 200 while the seeded row is the user's latest, 404 once the daemon's start-up run has computed a newer
            // one: either is the acknowledgement's whole answer, which is what this case is about.
            #expect(
                [200, 404].contains(replies.last?.status), "the acknowledgement: \(String(describing: replies.last))")
            // The close follows the last reply; on a busy machine it may arrive a moment after it.
            let closedAfter = closed ? true : await client.readUntilClosed(timeout: .seconds(3)).after != nil
            #expect(closedAfter, "the server did not close after the replies to a half-closed client")
        }
    }

    /// HEAD answers with GET's status and headers (`Content-Length` included) and no body, on every GET route;
    /// a GET pipelined behind each HEAD is answered right after it.
    @Test func headAnswersWithTheHeadersOfGetAndNoBody() async throws {
        try await Self.withDaemon { daemon, _ in
            let token = "Authorization: Bearer \(TestTokens.user(1))\r\n"
            for (path, extra) in [
                ("/healthz", ""), ("/readyz", ""), ("/openapi.yaml", ""), ("/metrics", ""), (Self.today, token),
            ] {
                let client = try HostileSocket(port: daemon.port)
                let head = "HEAD \(path) HTTP/1.1\r\nHost: x\r\nX-Request-Id: h1\r\n" + extra + "\r\n"
                #expect(await client.send(head + Self.get(path, id: "g2", extra: extra)))
                let (replies, _) = await client.readResponses(bodyless: [true, false])
                try #require(replies.count == 2, "\(path): \(replies)")
                let (headReply, getReply) = (replies[0], replies[1])
                #expect(
                    headReply.headers["x-request-id"] == "h1" && getReply.headers["x-request-id"] == "g2",
                    "\(path): \(replies)")
                #expect(
                    headReply.status == getReply.status, "\(path): HEAD \(headReply.status), GET \(getReply.status)")
                #expect(headReply.headers["content-type"] == getReply.headers["content-type"], "\(path)")
                if path != "/metrics" {  // the metrics change between the two requests
                    #expect(headReply.headers["content-length"] == String(getReply.body.count), "\(path): \(headReply)")
                }
            }
        }
    }

    /// An `Upgrade: h2c` request is answered as HTTP/1.1 and 16 MiB sent after it are not buffered; a CONNECT is
    /// refused; the connection is closed or keeps serving, never frozen; fresh clients are served.
    @Test func upgradeAndConnectDoNotFreezeTheConnection() async throws {
        try await Self.withDaemon { daemon, _ in
            let baseline = ProcessProbe.residentKiB(daemon.pid)
            let client = try HostileSocket(port: daemon.port)
            let upgrade = Self.get(
                "/healthz", id: "u1",
                extra:
                    "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
            )
            #expect(await client.send(upgrade + Self.get("/healthz", id: "u2")))
            let (replies, closed) = await client.readResponses(bodyless: [false, false], timeout: .seconds(3))
            #expect(replies.first?.status == 200, "\(replies)")
            let answered = replies.count == 2 && replies[1].status == 200
            let refused = replies.first?.headers["connection"]?.lowercased() == "close" && closed
            #expect(
                answered || refused,
                "the request after an Upgrade was neither answered nor refused: \(replies), closed: \(closed)")
            // 16 MiB of anything after it.
            let junk = [UInt8](repeating: 0x41, count: 1 << 20)
            var sent = 0
            let started = ContinuousClock.now
            while sent < 16 << 20, ContinuousClock.now - started < .seconds(4) {
                guard let accepted = client.sendNow(junk) else { break }
                sent += accepted
                if accepted == 0 { try await Task.sleep(for: .milliseconds(10)) }
            }
            let grown = ProcessProbe.residentKiB(daemon.pid) - baseline
            #expect(
                grown <= Self.memoryBoundKiB,
                "RSS grew \(grown / 1024) MB after \(sent >> 20) MiB sent behind an Upgrade")
            client.close()

            let connect = try HostileSocket(port: daemon.port)
            #expect(
                await connect.send(
                    "CONNECT 127.0.0.1:\(daemon.port) HTTP/1.1\r\nHost: 127.0.0.1:\(daemon.port)\r\n\r\n"))
            let (connectReplies, _) = await connect.readResponses(bodyless: [true], timeout: .seconds(3))
            let status = try #require(connectReplies.first?.status, "no answer to CONNECT")
            #expect(status >= 400, "CONNECT answered \(status)")
            await Self.expectHealthy(daemon, "after Upgrade and CONNECT")
        }
    }

    /// `Expect: 100-continue`: a 100 before the body when the body is acceptable, a 413 at once (no 100, no body
    /// read) when its declared length is over the limit; an unknown expectation is a 417.
    @Test func expectContinue() async throws {
        try await Self.withDaemon { daemon, _ in
            let body = #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#
            let head =
                "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(TestTokens.user(1))\r\n"
            let client = try HostileSocket(port: daemon.port)
            #expect(await client.send(head + "Expect: 100-continue\r\nContent-Length: \(body.utf8.count)\r\n\r\n"))
            let (interim, _) = await client.readResponses(bodyless: [true], timeout: .seconds(3))
            #expect(interim.first?.status == 100, "\(interim)")
            #expect(await client.send(body))
            let (final, _) = await client.readResponses(bodyless: [false], timeout: .seconds(5))
            #expect(final.first.map { [200, 404].contains($0.status) } == true, "\(final)")

            let large = try HostileSocket(port: daemon.port)
            #expect(await large.send(head + "Expect: 100-continue\r\nContent-Length: 1000000\r\n\r\n"))
            let (refused, closedWithIt) = await large.readResponses(bodyless: [false], timeout: .seconds(3))
            // The close follows the reply; on a busy machine it may arrive a moment after it.
            let closed = closedWithIt ? true : await large.readUntilClosed(timeout: .seconds(3)).after != nil
            #expect(refused.first?.status == 413 && closed, "\(refused), closed: \(closed)")

            let unknown = try HostileSocket(port: daemon.port)
            #expect(await unknown.send(head + "Expect: teapot\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body))
            let (failed, _) = await unknown.readResponses(bodyless: [false], timeout: .seconds(3))
            #expect(failed.first?.status == 417, "\(failed)")
        }
    }

    /// Absolute-form targets (RFC 9112 §3.2.2: a server must accept them) are routed by their path.
    @Test func absoluteFormTargetsAreRoutedByTheirPath() async throws {
        try await Self.withDaemon { daemon, _ in
            let client = try HostileSocket(port: daemon.port)
            let token = "Authorization: Bearer \(TestTokens.user(1))\r\n"
            #expect(
                await client.send(
                    Self.get("http://127.0.0.1:\(daemon.port)/healthz", id: "a1")
                        + Self.get("HTTP://example.com/readyz?x=1", id: "a2")
                        + Self.get("http://localhost\(Self.today)", id: "a3", extra: token)
                        + Self.get("http://127.0.0.1:\(daemon.port)/no-such-route", id: "a4")))
            let (replies, _) = await client.readResponses(bodyless: [false, false, false, false])
            #expect(replies.map(\.status) == [200, 200, 200, 404], "\(replies)")
            #expect(replies.map { $0.headers["x-request-id"] ?? "" } == ["a1", "a2", "a3", "a4"], "\(replies)")
            #expect(replies.count > 2 && replies[2].text.contains(#""computedAt":"#), "\(replies)")
        }
    }

    /// A 413 closes the connection: requests pipelined behind the oversized body are never dispatched (an admin
    /// trigger behind it creates no job), whether the length was declared or the body was chunked.
    @Test func nothingIsDispatchedAfterA413() async throws {
        try await Self.withDaemon { daemon, database in
            let trigger =
                "POST /v1/admin/recompute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(DaemonProcess.secrets.adminToken)\r\n"
                + "Content-Length: 0\r\n\r\n"
            // The whole oversized body is sent, so that the trigger behind it is a request of its own.
            let declared =
                "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n"
                + String(repeating: " ", count: 20000)
            var chunked =
                "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            for _ in 0..<5 { chunked += "1000\r\n" + String(repeating: " ", count: 4096) + "\r\n" }
            chunked += "0\r\n\r\n"
            for (name, first) in [("declared", declared), ("chunked", chunked)] {
                let client = try HostileSocket(port: daemon.port)
                #expect(await client.send(first + trigger + Self.get("/healthz")))
                let (replies, closed) = await client.readResponses(
                    bodyless: [false, false, false], timeout: .seconds(5))
                #expect(replies.map(\.status) == [413], "\(name): \(replies)")
                #expect(replies.first?.headers["connection"]?.lowercased() == "close", "\(name): \(replies)")
                #expect(closed, "\(name): the connection stayed open after the 413")
            }
            try await Task.sleep(for: .milliseconds(300))
            #expect(
                try await database.value("SELECT count(*) FROM recompute_jobs") == "0",
                "a request behind a 413 was dispatched")
        }
    }

    // MARK: Floods and shutdown

    /// 16 connections ask for `/readyz` back to back for 3 s: the readiness probe (a transaction that writes WAL)
    /// runs at most once a second (counted in the WAL with pg_waldump), every answer says how old its result is,
    /// and the latest read is answered meanwhile.
    @Test func readyzFloodCostsOneProbeASecond() async throws {
        try await Self.withDaemon { daemon, database in
            let startLSN = try #require(try await database.value("SELECT pg_current_wal_flush_lsn()"))
            let seconds = 3.0
            let answers = try await withThrowingTaskGroup(of: (Int, Set<Int>, Bool).self) { group in
                for _ in 0..<16 {
                    group.addTask { try await Self.hammer(port: daemon.port, path: "/readyz", seconds: seconds) }
                }
                var total = (0, Set<Int>(), true)
                for try await (count, statuses, aged) in group {
                    total = (total.0 + count, total.1.union(statuses), total.2 && aged)
                }
                return total
            }
            let latest = try await daemon.send(Self.today, headers: TestTokens.bearer(TestTokens.user(1)))
            #expect(latest.status == 200, "\(latest)")
            let endLSN = try #require(try await database.value("SELECT pg_current_wal_flush_lsn()"))
            let probes = try await Self.readinessProbes(database: database, from: startLSN, to: endLSN)
            #expect(answers.0 > 100, "only \(answers.0) answers to /readyz in \(seconds) s")
            #expect(answers.1 == [200], "statuses \(answers.1)")
            #expect(answers.2, "an answer to /readyz did not say how old its result is")
            #expect(
                probes <= Int(seconds) + 2,
                "\(probes) readiness probes wrote WAL for \(answers.0) requests in \(seconds) s")
        }
    }

    /// Keep-alive requests on one connection for `seconds`: how many were answered, their statuses, and whether
    /// every body carried the age of its result.
    static func hammer(port: Int, path: String, seconds: Double) async throws -> (Int, Set<Int>, Bool) {
        let client = try HostileSocket(port: port)
        var count = 0
        var statuses = Set<Int>()
        var aged = true
        let until = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while ContinuousClock.now < until {
            guard await client.send(Self.get(path)) else { break }
            let (replies, _) = await client.readResponses(bodyless: [false], timeout: .seconds(5))
            guard let reply = replies.first else { break }
            count += 1
            statuses.insert(reply.status)
            aged = aged && reply.text.contains(#""ageSeconds":"#)
        }
        return (count, statuses, aged)
    }

    /// The readiness probes committed between two WAL positions: their logical messages, read with pg_waldump
    /// from the test cluster's WAL.
    static func readinessProbes(database: TestDatabase, from start: String, to end: String) async throws -> Int {
        let bin = try #require(
            ProcessInfo.processInfo.environment["METRICSD_PG_BIN"], "METRICSD_PG_BIN is not set (scripts/test sets it)")
        let dataDirectory = try #require(try await database.value("SHOW data_directory"))
        let process = Process()
        process.executableURL = URL(fileURLWithPath: bin + "/pg_waldump")
        process.arguments = ["-p", dataDirectory + "/pg_wal", "-s", start, "-e", end, "-r", "LogicalMessage"]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = Pipe()
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return output.split(separator: "\n").filter { $0.contains(#"prefix "metricsd""#) }.count
    }

    /// SIGTERM with an idle keep-alive client, a slowloris, a client pipelining without reading, a slow reader
    /// and a stalled body connected: the daemon exits 0 within its deadlines (write 2 s, request 1 s), not
    /// METRICSD_SHUTDOWN_SECONDS (10 s).
    @Test func shutdownWithHostileClientsConnected() async throws {
        await withKnownIssue("graceful shutdown waits for hostile clients", isIntermittent: true) {
            try await Self.withDaemon { daemon, _ in
                var clients: [HostileSocket] = []
                let idle = try HostileSocket(port: daemon.port)
                await idle.send(Self.get("/healthz"))
                clients.append(idle)
                let slowloris = try HostileSocket(port: daemon.port)
                await slowloris.send("GET /healthz HTTP/1.1\r\nHo")
                clients.append(slowloris)
                let pipeliner = try HostileSocket(port: daemon.port, receiveBuffer: 4096)
                let burst = Array([[UInt8]](repeating: Array(Self.get("/openapi.yaml").utf8), count: 256).joined())
                for _ in 0..<20 { _ = pipeliner.sendNow(burst) }
                clients.append(pipeliner)
                let slowReader = try HostileSocket(port: daemon.port, receiveBuffer: 2048)
                await slowReader.send(Self.get("/openapi.yaml"))
                clients.append(slowReader)
                let stalled = try HostileSocket(port: daemon.port)
                await stalled.send(
                    "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"ver")
                clients.append(stalled)
                try await Task.sleep(for: .milliseconds(200))

                let started = ContinuousClock.now
                daemon.signal(SIGTERM)
                let status = await daemon.waitForExit(timeout: .seconds(20))
                let took = ContinuousClock.now - started
                #expect(status == 0, "exit status \(String(describing: status)); output:\n\(daemon.log.suffix(2000))")
                #expect(took <= .seconds(6), "shutdown took \(took) with hostile clients connected")
                for client in clients { client.close() }
            }
        }
    }
}
