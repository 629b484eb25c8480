import Foundation
import Glibc
import HTTPTypes
import HealthMetrics
import Logging
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdReads
import MetricsdTestSupport
import MetricsdWork
import Testing

/// The one request path every endpoint takes (`HTTPConnectionHandler` → `APIDispatcher`), over real sockets
/// against the real database: requests pipelined on one connection come back in order with their own request
/// ids, whatever mix of routes; a client that half-closed still gets its answers; `Connection: close` is honoured;
/// a store failure is a 500 logged once; and the request log writes one line per request with the same fields
/// whatever the route.
@Suite struct RequestPathTests {
    static let today = "/v1/profile/metrics/today"

    /// Status, headers (lowercased names) and body of one response off the wire.
    struct Wire: CustomStringConvertible {
        let status: Int
        let headers: [String: String]
        let body: String
        var description: String { "\(self.status) \(self.headers) \(self.body.prefix(200))" }
    }

    /// Sends `text` on a new connection (optionally half-closing after it) and reads `count` responses in order.
    static func exchange(port: Int, _ text: String, expecting count: Int, halfClose: Bool = false) async throws
        -> [Wire]
    {
        let descriptor = try #require(RawHTTP.connect(port: port))
        #expect(RawHTTP.send(descriptor, text))
        if halfClose { shutdown(descriptor, Int32(SHUT_WR)) }
        return await withCheckedContinuation { (continuation: CheckedContinuation<[Wire], Never>) in
            Thread.detachNewThread {
                continuation.resume(returning: Self.read(descriptor, count: count, timeout: 60))
            }
        }
    }

    private static func read(_ descriptor: Int32, count: Int, timeout: Double) -> [Wire] {
        defer { close(descriptor) }
        var buffer: [UInt8] = []
        var responses: [Wire] = []
        let deadline = Date().addingTimeInterval(timeout)
        var chunk = [UInt8](repeating: 0, count: 65536)
        while responses.count < count, Date() < deadline {
            while let (wire, used) = Self.parse(buffer) {
                responses.append(wire)
                buffer.removeFirst(used)
            }
            if responses.count == count { break }
            var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 200) > 0 else { continue }
            let read = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if read <= 0 { break }
            buffer += chunk[0..<read]
        }
        while responses.count < count, let (wire, used) = Self.parse(buffer) {
            responses.append(wire)
            buffer.removeFirst(used)
        }
        return responses
    }

    /// One response at the start of `bytes`, and how many bytes it took.
    private static func parse(_ bytes: [UInt8]) -> (Wire, Int)? {
        guard let (response, used) = WireResponse.parse(bytes[...], bodyless: false) else { return nil }
        return (Wire(status: response.status, headers: response.headers, body: response.text), used)
    }

    static func get(_ path: String, token: String?, id: String, extra: String = "") -> String {
        var text = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: \(id)\r\n"
        if let token { text += "Authorization: Bearer \(token)\r\n" }
        return text + extra + "\r\n"
    }

    static func acknowledge(token: String, id: String, body: String) -> String {
        "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: \(id)\r\n"
            + "Authorization: Bearer \(token)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n"
            + body
    }

    /// User 1 with one row of metrics, and the API over the test database serving them.
    static func serveUserOne(_ body: @escaping @Sendable (Int) async throws -> Void) async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(
                user: 1, bmi: "24.5", bmr: 1650, tdee: 2475, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database, body)
        }
    }

    /// Every outcome of the busiest endpoint, with and without a query string (which it ignores): 200, each
    /// kind of 401, 404 (unknown user, invalid settings), and 200 for a just-onboarded user (computed on request).
    /// The same code answers both forms, so the answers are identical apart from the request id.
    @Test func everyOutcomeOfTheLatestMetricsRead() async throws {
        try await withTestDatabase { database in
            var noHeight = SeedUser.valid(4)
            noHeight.height = nil
            try await database.seed([.valid(1), .valid(2), .valid(3), noHeight])
            try await database.insertMetrics(
                user: 1, bmi: "24.5", bmr: 1650, tdee: 2475, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database) { port in
                let expired = SignedTokens.hs256(
                    claims: ["sub": "1", "exp": SignedTokens.now - 3600], key: Array(APIServer.jwtSecret.utf8))
                let cases: [(String, String?, Int, String)] = [
                    ("latest", TestTokens.user(1), 200, #""bmi":24.5"#),
                    ("no token", nil, 401, #""code":"auth.token_missing""#),
                    ("garbage", "not.a.token", 401, #""code":"token.malformed""#),
                    ("expired", expired, 401, #""code":"token.expired""#),
                    (
                        "wrong key",
                        SignedTokens.hs256(claims: SignedTokens.claims(sub: "1"), key: Array("other".utf8)), 401,
                        #""code":"token.bad_signature""#
                    ),
                    ("unknown user", TestTokens.user(999), 404, #""code":"metrics.user_unknown""#),
                    ("invalid settings", TestTokens.user(4), 404, #""code":"metrics.settings_invalid""#),
                ]
                for (name, token, status, contains) in cases {
                    let replies = try await Self.exchange(
                        port: port,
                        Self.get(Self.today, token: token, id: "a-\(name.count)")
                            + Self.get(Self.today + "?via=query", token: token, id: "b-\(name.count)"),
                        expecting: 2)
                    try #require(replies.count == 2, "\(name): \(replies)")
                    let (plain, query) = (replies[0], replies[1])
                    #expect(plain.status == status, "\(name): \(plain)")
                    #expect(plain.body.contains(contains), "\(name): \(plain)")
                    #expect(plain.body.hasSuffix("}\n"), "\(name): a JSON body ends with a newline")
                    #expect(plain.status == query.status && plain.body == query.body, "\(name): \(plain) vs \(query)")
                    #expect(
                        Set(plain.headers.keys) == Set(query.headers.keys),
                        "\(name): \(plain.headers) vs \(query.headers)")
                    #expect(plain.headers["x-request-id"] == "a-\(name.count)")
                    #expect(query.headers["x-request-id"] == "b-\(name.count)")
                    #expect(plain.headers["date"]?.hasSuffix(" GMT") == true, "\(name): \(plain.headers)")
                    #expect(plain.headers["content-type"] == "application/json")
                    if status == 401 { #expect(plain.headers["www-authenticate"] == "Bearer") }
                }
                // A just-onboarded user: computed and stored on the first read.
                let first = try await Self.exchange(
                    port: port, Self.get(Self.today, token: TestTokens.user(2), id: "onboarded"), expecting: 1)
                #expect(first.first?.status == 200, "\(first)")
                #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE user_id = 2") == "1")
                let again = try await Self.exchange(
                    port: port, Self.get(Self.today, token: TestTokens.user(2), id: "again"), expecting: 1)
                #expect(again.first?.body == first.first?.body)
            }
        }
    }

    /// Requests of every kind pipelined on one connection come back in the order they were sent, each with its
    /// own request id; more requests than the handler holds before it stops reading (`maxHeldParts`) are all
    /// answered.
    @Test func pipelinedRequestsAreAnsweredInOrder() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            try await database.insertMetrics(
                user: 1, bmi: "24.5", bmr: 1650, tdee: 2475, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await database.insertMetrics(
                user: 2, bmi: "31.0", bmr: 1900, tdee: 2600, date: "2025-10-29", computedAt: "2025-10-29T15:00:00.000Z")
            try await APIServer.run(database: database) { port in
                let one = TestTokens.user(1)
                let two = TestTokens.user(2)
                let ack = #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#
                var text = ""
                var expected: [(id: String, status: Int, contains: String)] = []
                func add(_ request: String, id: String, status: Int, contains: String) {
                    text += request
                    expected.append((id, status, contains))
                }
                add(
                    Self.acknowledge(token: one, id: "r0", body: ack), id: "r0", status: 200,
                    contains: #""acknowledged":true"#)
                add(
                    Self.get(Self.today, token: one, id: "r1"), id: "r1", status: 200, contains: #""acknowledged":true"#
                )
                add(Self.get("/healthz", token: nil, id: "r2"), id: "r2", status: 200, contains: #""status":"ok""#)
                add(Self.get(Self.today, token: two, id: "r3"), id: "r3", status: 200, contains: #""bmi":31.0"#)
                add(
                    Self.get(Self.today, token: nil, id: "r4"), id: "r4", status: 401,
                    contains: #""code":"auth.token_missing""#)
                add(
                    Self.get(Self.today + "?via=query", token: two, id: "r5"), id: "r5", status: 200,
                    contains: #""bmi":31.0"#)
                for index in 6..<26 {
                    let (token, bmi) = index % 2 == 0 ? (one, "24.5") : (two, "31.0")
                    add(
                        Self.get(Self.today, token: token, id: "r\(index)"), id: "r\(index)", status: 200,
                        contains: #""bmi":\#(bmi)"#)
                }
                add(
                    Self.get("/nowhere", token: nil, id: "r26"), id: "r26", status: 404,
                    contains: #""code":"route.not_found""#)
                add(Self.get(Self.today, token: one, id: "r27"), id: "r27", status: 200, contains: #""bmi":24.5"#)
                let replies = try await Self.exchange(port: port, text, expecting: expected.count)
                #expect(replies.count == expected.count, "\(replies.count) of \(expected.count) responses")
                for (reply, want) in zip(replies, expected) {
                    #expect(reply.headers["x-request-id"] == want.id, "out of order: \(reply) where \(want.id) was due")
                    #expect(reply.status == want.status, "\(want.id): \(reply)")
                    #expect(reply.body.contains(want.contains), "\(want.id): \(reply)")
                    #expect(reply.body.hasSuffix("\n"), "\(want.id): the body ends with a newline")
                }
            }
        }
    }

    /// A client that sends its requests and closes its side at once still gets every response.
    @Test func halfClosedClientGetsItsResponses() async throws {
        try await Self.serveUserOne { port in
            let token = TestTokens.user(1)
            let alone = try await Self.exchange(
                port: port, Self.get(Self.today, token: token, id: "h1"), expecting: 1, halfClose: true)
            #expect(alone.map(\.status) == [200], "\(alone)")
            let pair = try await Self.exchange(
                port: port,
                Self.get(Self.today, token: token, id: "h2")
                    + Self.get(Self.today + "?via=query", token: token, id: "h3"),
                expecting: 2, halfClose: true)
            #expect(pair.map(\.status) == [200, 200], "\(pair)")
            #expect(pair.map { $0.headers["x-request-id"] ?? "" } == ["h2", "h3"])
        }
    }

    /// `Connection: close` is answered (saying so) and the connection closed: nothing after it is read.
    @Test func connectionCloseIsHonoured() async throws {
        try await Self.serveUserOne { port in
            let token = TestTokens.user(1)
            let replies = try await Self.exchange(
                port: port,
                Self.get(Self.today, token: token, id: "c1")
                    + Self.get(Self.today, token: token, id: "c2", extra: "Connection: close\r\n")
                    + Self.get(Self.today, token: token, id: "c3"),
                expecting: 3)
            #expect(
                replies.map { $0.headers["x-request-id"] ?? "" } == ["c1", "c2"],
                "nothing after Connection: close: \(replies)")
            #expect(replies.map(\.status) == [200, 200])
            #expect(replies.last?.headers["connection"] == "close", "\(replies)")
        }
    }

    /// A database failure is a 500 naming only the request id, its detail logged once.
    @Test func storeFailureIsA500LoggedOnce() async throws {
        let (logger, logs) = CapturingLogHandler.logger()
        try await APIServer.run(store: HostileInputTests.FailingStore(), logger: logger) { port in
            let token = TestTokens.user(1)
            let replies = try await Self.exchange(
                port: port,
                Self.get(Self.today, token: token, id: "f1")
                    + Self.get(Self.today + "?via=query", token: token, id: "f2"), expecting: 2)
            try #require(replies.count == 2, "\(replies)")
            #expect(replies.map(\.status) == [500, 500])
            #expect(replies[0].body.contains("f1") && replies[1].body.contains("f2"), "\(replies)")
            #expect(!replies[0].body.contains("syntax error"))
            let errors = logs.all.filter { $0.level == .error }
            #expect(errors.filter { $0.metadata["metricsd.request.id"] == "f1" }.count == 1, "\(errors)")
            #expect(errors.filter { $0.metadata["metricsd.request.id"] == "f2" }.count == 1, "\(errors)")
        }
    }

    // MARK: The request log

    /// One line per request, with the same fields whatever the endpoint: method, route template, status,
    /// duration, the user id once authenticated, the request id (under one key). `all` logs a 200; `errors`
    /// (the default) logs the 401 and the 404 but not the 200; `off` logs none.
    @Test func requestLogLines() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(
                user: 1, bmi: "24.5", bmr: 1650, tdee: 2475, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            let store = PostgresStore(pool: database.pool, formula: .current, logger: database.logger)
            for mode in RequestLogMode.allCases {
                let (logger, logs) = CapturingLogHandler.logger()
                try await APIServer.run(
                    store: store, jobs: RecomputeJobs(pool: database.pool), logger: logger, requestLog: mode
                ) { port in
                    let requests =
                        Self.get(Self.today, token: TestTokens.user(1), id: "log-200")
                        + Self.get(Self.today, token: nil, id: "log-401")
                        + Self.get("/v1/admin/recompute/7", token: APIServer.adminToken, id: "log-404")
                    let replies = try await Self.exchange(port: port, requests, expecting: 3)
                    #expect(replies.map(\.status) == [200, 401, 404], "\(replies)")
                }
                let lines = logs.all.filter { $0.metadata["metricsd.http.route"] != nil }
                let byID = Dictionary(lines.map { ($0.metadata["metricsd.request.id"] ?? "", $0) }) { first, _ in first
                }
                switch mode {
                case .off:
                    #expect(lines.isEmpty, "\(lines)")
                case .errors:
                    #expect(Set(byID.keys) == ["log-401", "log-404"], "\(lines)")
                case .all:
                    #expect(Set(byID.keys) == ["log-200", "log-401", "log-404"], "\(lines)")
                    let ok = try #require(byID["log-200"])
                    #expect(ok.level == .info)
                    #expect(ok.metadata["metricsd.http.method"] == "GET")
                    #expect(ok.metadata["metricsd.http.route"] == "/v1/profile/metrics/today")
                    #expect(ok.metadata["metricsd.http.status"] == "200")
                    #expect(ok.metadata["metricsd.user.id"] == "1")
                    #expect(ok.message.hasPrefix("GET /v1/profile/metrics/today 200 "), "\(ok.message)")
                    #expect(Double(ok.metadata["metricsd.http.duration_ms"] ?? "") != nil, "\(ok.metadata)")
                    #expect(ok.metadata["hb.request.id"] == nil, "the request id is written once")
                    #expect(ok.metadata["metricsd.error.code"] == nil, "a success has no error code")
                }
                if mode != .off {
                    let refused = try #require(byID["log-401"])
                    #expect(refused.metadata["metricsd.http.status"] == "401")
                    #expect(refused.metadata["metricsd.http.route"] == "/v1/profile/metrics/today")
                    #expect(refused.metadata["metricsd.user.id"] == nil, "no user before authentication")
                    #expect(refused.metadata["metricsd.error.code"] == "auth.token_missing", "\(refused.metadata)")
                    let missing = try #require(byID["log-404"])
                    #expect(
                        missing.metadata["metricsd.http.route"] == "/v1/admin/recompute/{id}",
                        "the template, not the path")
                    #expect(missing.metadata["metricsd.http.status"] == "404")
                    #expect(missing.metadata["metricsd.error.code"] == "job.not_found", "\(missing.metadata)")
                }
            }
        }
    }

    /// A setting taken out of the reloadable configuration file falls back on reload to what it would be without
    /// the file (the environment's value), not to the file's old value: each reload merges the file into the
    /// environment as it was before the file, never into the one merged at start. A setting only a restart applies
    /// is named in a notice and left as it runs.
    @Test func aSettingTakenOutOfTheFileFallsBackOnReload() async throws {
        try await withTestDatabase { database in
            let file = try scratchFile("metricsd.conf", "METRICSD_DAILY_AT=03:30\n")
            let daemon = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_CONFIG_FILE": file, "METRICSD_DAILY_AT": "01:15"])
            try "METRICSD_DAILY_AT=04:45\n".write(toFile: file, atomically: true, encoding: .utf8)
            daemon.signal(SIGHUP)
            let first = await DaemonProcess.eventually(timeout: .seconds(20)) {
                daemon.log.contains("metricsd.daily_at=04:45")
            }
            #expect(first, "the file's new value was not reloaded:\n\(daemon.log.suffix(2000))")
            #expect(!daemon.log.contains("at the next restart"), "\(daemon.log.suffix(2000))")
            // A setting only a restart applies is named, not taken; the reloadable one beside it is taken.
            try "# METRICSD_DAILY_AT taken out\nMETRICSD_CHUNK_SIZE=1234\n".write(
                toFile: file, atomically: true, encoding: .utf8)
            daemon.signal(SIGHUP)
            let second = await DaemonProcess.eventually(timeout: .seconds(20)) {
                daemon.log.split(separator: "\n").filter { $0.contains("Reloaded") }.count >= 2
                    && daemon.log.contains("at the next restart")
            }
            #expect(second, "no second reload:\n\(daemon.log.suffix(2000))")
            let last = daemon.log.split(separator: "\n").last { $0.contains("Reloaded") }.map(String.init) ?? ""
            #expect(last.contains("metricsd.daily_at=01:15"), "\(last)")
            let waiting = daemon.log.split(separator: "\n").last { $0.contains("at the next restart") }.map(String.init)
            #expect(waiting?.contains("METRICSD_CHUNK_SIZE") == true, "\(waiting ?? "")")
            #expect(waiting?.contains("1234") == false, "a value in the notice: \(waiting ?? "")")
            await daemon.stop()
        }
    }

    /// `METRICSD_REQUEST_LOG` changes on reload: the real daemon, switched from `off` to `all` by SIGHUP through
    /// its reloadable configuration file.
    @Test func requestLogSwitchesOnReload() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            let file = try scratchFile("metricsd.conf", "METRICSD_REQUEST_LOG=off\n")
            let daemon = try await DaemonProcess.start(database: database, extra: ["METRICSD_CONFIG_FILE": file])
            let headers = TestTokens.bearer(TestTokens.user(1)).merging([
                HTTPField.Name("X-Request-Id")!: "before-reload"
            ])
            #expect(try await daemon.send("/v1/profile/metrics/today", headers: headers).status == 200)
            try "METRICSD_REQUEST_LOG=all\n".write(toFile: file, atomically: true, encoding: .utf8)
            daemon.signal(SIGHUP)
            let reloaded = await DaemonProcess.eventually(timeout: .seconds(20)) { daemon.log.contains("Reloaded") }
            #expect(reloaded, "\(daemon.log.suffix(2000))")
            let after = TestTokens.bearer(TestTokens.user(1)).merging([HTTPField.Name("X-Request-Id")!: "after-reload"])
            #expect(try await daemon.send("/v1/profile/metrics/today", headers: after).status == 200)
            let logged = await DaemonProcess.eventually(timeout: .seconds(10)) { daemon.log.contains("after-reload") }
            #expect(logged, "no request line after the reload:\n\(daemon.log.suffix(2000))")
            #expect(!daemon.log.contains("before-reload"), "a request line while the request log was off")
            let line = daemon.log.split(separator: "\n").first { $0.contains("after-reload") }.map(String.init) ?? ""
            #expect(line.contains("GET /v1/profile/metrics/today 200"), "\(line)")
            #expect(line.contains("user.id=1") || line.contains("metricsd.user.id=1"), "\(line)")
            await daemon.stop()
        }
    }
}
