import Foundation
import Glibc
import HTTPTypes
import HealthMetrics
import Logging
import MetricsdApp
import MetricsdPostgres
import Testing

/// Issue 8: `GET /v1/profile/metrics/today` is answered by `TodayFastPath` on the event loop, not by the router.
/// Over real sockets against the real database: it answers exactly as the route does (status, headers, body, for
/// every outcome), keeps responses in request order when hot and routed requests are pipelined on one
/// connection, answers a request whose client half-closed, and never reads a client's requests faster than it
/// answers them. The route itself stays (a query string, a body or `Connection: close` send a request to it), so
/// every comparison below is the hot path against the router on the same server.
@Suite struct HotPathTests {
    static let hot = "/v1/profile/metrics/today"
    /// The same route through the router (a query string is not the hot path's exact target).
    static let routed = "/v1/profile/metrics/today?via=router"

    /// Status, headers (lowercased names) and body of one response off the wire.
    struct Wire: CustomStringConvertible {
        let status: Int
        let headers: [String: String]
        let body: String
        var description: String { "\(self.status) \(self.headers) \(self.body.prefix(200))" }
    }

    /// Sends `text` on a new connection (optionally half-closing after it) and reads `count` responses in order.
    static func exchange(port: Int, _ text: String, expecting count: Int, halfClose: Bool = false) async throws -> [Wire] {
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

    /// One response with a `Content-Length` at the start of `bytes`, and how many bytes it took.
    private static func parse(_ bytes: [UInt8]) -> (Wire, Int)? {
        guard bytes.count >= 4,
            let end = (0...(bytes.count - 4)).first(where: { bytes[$0] == 13 && bytes[$0 + 1] == 10 && bytes[$0 + 2] == 13 && bytes[$0 + 3] == 10 })
        else { return nil }
        var lines = String(decoding: bytes[..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else { return nil }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        guard let length = headers["content-length"].flatMap({ Int($0) }), bytes.count >= end + 4 + length else { return nil }
        return (Wire(status: status, headers: headers, body: String(decoding: bytes[(end + 4)..<(end + 4 + length)], as: UTF8.self)), end + 4 + length)
    }

    static func get(_ path: String, token: String?, id: String, extra: String = "") -> String {
        var text = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: \(id)\r\n"
        if let token { text += "Authorization: Bearer \(token)\r\n" }
        return text + extra + "\r\n"
    }

    static func acknowledge(token: String, id: String, body: String) -> String {
        "POST /v1/profile/metrics/acknowledge HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: \(id)\r\n"
            + "Authorization: Bearer \(token)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body
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

    /// The hot path and the router answer every outcome alike: 200, 401 (each kind), 404 (unknown user, user
    /// whose settings are invalid), and 200 for a just-onboarded user (computed on request).
    @Test func answersExactlyAsTheRouteDoes() async throws {
        try await withTestDatabase { database in
            var noHeight = SeedUser.valid(4)
            noHeight.height = nil
            try await database.seed([.valid(1), .valid(2), .valid(3), noHeight])
            try await database.insertMetrics(
                user: 1, bmi: "24.5", bmr: 1650, tdee: 2475, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database) { port in
                let expired = SignedTokens.hs256(
                    claims: ["sub": "1", "exp": SignedTokens.now - 3600], key: Array(APIServer.jwtSecret.utf8))
                let cases: [(String, String?)] = [
                    ("latest", TestTokens.user(1)), ("no token", nil), ("garbage", "not.a.token"), ("expired", expired),
                    ("wrong key", SignedTokens.hs256(claims: SignedTokens.claims(sub: "1"), key: Array("other".utf8))),
                    ("unknown user", TestTokens.user(999)), ("invalid settings", TestTokens.user(4)),
                ]
                for (name, token) in cases {
                    let replies = try await Self.exchange(
                        port: port,
                        Self.get(Self.hot, token: token, id: "hot-\(name.count)") + Self.get(Self.routed, token: token, id: "routed-\(name.count)"),
                        expecting: 2)
                    try #require(replies.count == 2, "\(name): \(replies)")
                    let (hot, routed) = (replies[0], replies[1])
                    #expect(hot.status == routed.status, "\(name): \(hot) vs \(routed)")
                    #expect(hot.body == routed.body, "\(name)")
                    #expect(Set(hot.headers.keys) == Set(routed.headers.keys), "\(name): \(hot.headers) vs \(routed.headers)")
                    for header in ["content-type", "www-authenticate", "retry-after"] {
                        #expect(hot.headers[header] == routed.headers[header], "\(name): \(header)")
                    }
                    #expect(hot.headers["x-request-id"] == "hot-\(name.count)")
                    #expect(routed.headers["x-request-id"] == "routed-\(name.count)")
                    #expect(hot.headers["date"]?.hasSuffix(" GMT") == true, "\(name): \(hot.headers)")
                }
                // A just-onboarded user: the hot path computes and stores the row, as the route would.
                let first = try await Self.exchange(port: port, Self.get(Self.hot, token: TestTokens.user(2), id: "onboarded"), expecting: 1)
                #expect(first.first?.status == 200, "\(first)")
                #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE user_id = 2") == "1")
                let again = try await Self.exchange(port: port, Self.get(Self.routed, token: TestTokens.user(2), id: "again"), expecting: 1)
                #expect(again.first?.body == first.first?.body)
            }
        }
    }

    /// Hot and routed requests pipelined on one connection come back in the order they were sent, each with its
    /// own request id; more hot requests than the handler holds before it stops reading (`maxHeldParts`) are all
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
                add(Self.acknowledge(token: one, id: "r0", body: ack), id: "r0", status: 200, contains: #""acknowledged":true"#)
                add(Self.get(Self.hot, token: one, id: "r1"), id: "r1", status: 200, contains: #""acknowledged":true"#)
                add(Self.get("/healthz", token: nil, id: "r2"), id: "r2", status: 200, contains: #""status":"ok""#)
                add(Self.get(Self.hot, token: two, id: "r3"), id: "r3", status: 200, contains: #""bmi":31.0"#)
                add(Self.get(Self.hot, token: nil, id: "r4"), id: "r4", status: 401, contains: "missing bearer token")
                add(Self.get(Self.routed, token: two, id: "r5"), id: "r5", status: 200, contains: #""bmi":31.0"#)
                for index in 6..<26 {
                    let (token, bmi) = index % 2 == 0 ? (one, "24.5") : (two, "31.0")
                    add(Self.get(Self.hot, token: token, id: "r\(index)"), id: "r\(index)", status: 200, contains: #""bmi":\#(bmi)"#)
                }
                add(Self.get("/nowhere", token: nil, id: "r26"), id: "r26", status: 404, contains: "no such route")
                add(Self.get(Self.hot, token: one, id: "r27"), id: "r27", status: 200, contains: #""bmi":24.5"#)
                let replies = try await Self.exchange(port: port, text, expecting: expected.count)
                #expect(replies.count == expected.count, "\(replies.count) of \(expected.count) responses")
                for (reply, want) in zip(replies, expected) {
                    #expect(reply.headers["x-request-id"] == want.id, "out of order: \(reply) where \(want.id) was due")
                    #expect(reply.status == want.status, "\(want.id): \(reply)")
                    #expect(reply.body.contains(want.contains), "\(want.id): \(reply)")
                }
            }
        }
    }

    /// A client that sends its request and closes its side at once still gets the whole response (the router
    /// must not see the end of input before the hot request is answered); so does a routed request after it.
    @Test func halfClosedClientGetsItsResponses() async throws {
        try await Self.serveUserOne { port in
            let token = TestTokens.user(1)
            let alone = try await Self.exchange(port: port, Self.get(Self.hot, token: token, id: "h1"), expecting: 1, halfClose: true)
            #expect(alone.map(\.status) == [200], "\(alone)")
            let pair = try await Self.exchange(
                port: port, Self.get(Self.hot, token: token, id: "h2") + Self.get(Self.routed, token: token, id: "h3"),
                expecting: 2, halfClose: true)
            #expect(pair.map(\.status) == [200, 200], "\(pair)")
            #expect(pair.map { $0.headers["x-request-id"] ?? "" } == ["h2", "h3"])
        }
    }

    /// `Connection: close` goes to the router, which answers and closes the connection.
    @Test func connectionCloseIsHonoured() async throws {
        try await Self.serveUserOne { port in
            let token = TestTokens.user(1)
            let replies = try await Self.exchange(
                port: port,
                Self.get(Self.hot, token: token, id: "c1") + Self.get(Self.hot, token: token, id: "c2", extra: "Connection: close\r\n")
                    + Self.get(Self.hot, token: token, id: "c3"),
                expecting: 3)
            #expect(replies.map { $0.headers["x-request-id"] ?? "" } == ["c1", "c2"], "nothing after Connection: close: \(replies)")
            #expect(replies.map(\.status) == [200, 200])
        }
    }

    /// A database failure on the hot path is the router's 500 (request id, no detail), logged once.
    @Test func storeFailureIsTheRoutersError() async throws {
        let (logger, logs) = CapturingLogHandler.logger()
        try await APIServer.run(store: HostileInputTests.FailingStore(), logger: logger) { port in
            let token = TestTokens.user(1)
            let replies = try await Self.exchange(
                port: port, Self.get(Self.hot, token: token, id: "f1") + Self.get(Self.routed, token: token, id: "f2"), expecting: 2)
            try #require(replies.count == 2, "\(replies)")
            #expect(replies.map(\.status) == [500, 500])
            #expect(replies[0].body.contains("f1") && replies[1].body.contains("f2"), "\(replies)")
            #expect(!replies[0].body.contains("syntax error"))
            let errors = logs.all.filter { $0.level == .error }
            #expect(errors.filter { $0.metadata["metricsd.request.id"] == "f1" }.count == 1, "\(errors)")
            #expect(errors.filter { $0.metadata["metricsd.request.id"] == "f2" }.count == 1, "\(errors)")
        }
    }
}
