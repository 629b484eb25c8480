import Foundation
import HTTPTypes
import HealthMetrics
import Logging
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdReads
import MetricsdTestSupport
import MetricsdWork
import NIOCore
import Testing

/// Hostile input: 413 over 16 KiB, slow and idle connections closed, `X-Request-Id` round trip,
/// malformed and hostile input answered 400 (never 500) with nothing leaked, real faults as 500 with the
/// correlation id (body, header, log), and a database that is down as 503 with `Retry-After`.
@Suite struct HostileInputTests {
    static let acknowledgePath = "/v1/profile/metrics/acknowledge"
    static let computedAt = "2025-10-29T14:30:45.123Z"

    /// A database with user 1 and a metrics row computed at `computedAt`.
    static func withUserAndMetrics<T>(_ body: (TestDatabase) async throws -> T) async throws -> T {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(user: 1, date: "2025-10-29", computedAt: Self.computedAt)
            return try await body(database)
        }
    }

    static var userHeaders: HTTPFields {
        TestTokens.bearer(TestTokens.user(1)).merging([.contentType: "application/json"])
    }

    // MARK: 413

    @Test func bodiesOver16KiBGet413() async throws {
        try await Self.withUserAndMetrics { database in
            let daemon = try await DaemonProcess.start(database: database)
            let admin = TestTokens.bearer(APIServer.adminToken)
            let big =
                #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z","pad":""#
                + String(repeating: "x", count: 16 * 1024) + #""}"#
            for (path, headers) in [(Self.acknowledgePath, Self.userHeaders), ("/v1/admin/recompute", admin)] {
                let reply = try await daemon.send(path, method: .post, headers: headers, body: big)
                expectErrorBody(reply, status: 413, code: .bodyTooLarge)
            }
            // Exactly 16 KiB is allowed: a valid acknowledgement padded with whitespace to 16,384 bytes, of what GET
            // shows. The daemon's first daily run may replace today's row between the two (then the answer is the
            // documented 404 "updated"): read and acknowledge again until the row holds still.
            var exact = ""
            var accepted: APIReply?
            for _ in 0..<20 {
                let current = try await daemon.send("/v1/profile/metrics/today", headers: Self.userHeaders)
                let computedAt = try #require(current.json?["data"]?["metrics"]?["computedAt"]?.string, "\(current)")
                let valid = #"{"version":1,"metricsComputedAt":"\#(computedAt)"}"#
                exact = valid + String(repeating: " ", count: 16 * 1024 - valid.utf8.count)
                let reply = try await daemon.send(
                    Self.acknowledgePath, method: .post, headers: Self.userHeaders, body: exact)
                accepted = reply
                if reply.status != 404 { break }
                try await Task.sleep(for: .milliseconds(250))
            }
            #expect(accepted?.status == 200, "\(String(describing: accepted))")
            let oneMore = try await daemon.send(
                Self.acknowledgePath, method: .post, headers: Self.userHeaders, body: exact + " ")
            expectErrorBody(oneMore, status: 413, code: .bodyTooLarge)

            // Chunked, with no Content-Length to check up front.
            let connection = try RawConnection(port: daemon.port)
            var request =
                "POST \(Self.acknowledgePath) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(TestTokens.user(1))\r\n"
            request += "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            for _ in 0..<5 { request += "1000\r\n" + String(repeating: " ", count: 4096) + "\r\n" }
            request += "0\r\n\r\n"
            #expect(connection.send(request))
            let response = try #require(await connection.readResponse(), "no response to a chunked 20 KiB body")
            #expect(response.hasPrefix("HTTP/1.1 413"), "\(response.prefix(300))")
            #expect(response.contains(#""statusCode":413,"code":"request.body_too_large"}"#), "\(response.prefix(300))")
            #expect(response.lowercased().contains("x-request-id: "))

            // A declared length over the limit is refused at once, on any route, before a byte of body arrives.
            for path in ["/healthz", Self.acknowledgePath, "/v1/admin/recompute/1/cancel", "/no/such/route"] {
                let declared = try RawConnection(port: daemon.port)
                let started = ContinuousClock.now
                #expect(declared.send("POST \(path) HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"))
                let answer = try #require(await declared.readResponse(timeout: .seconds(5)), "\(path): no answer")
                #expect(answer.hasPrefix("HTTP/1.1 413"), "\(path): \(answer.prefix(200))")
                #expect(
                    ContinuousClock.now - started < .seconds(5),
                    "\(path): the 413 waited for the body (the request timeout is 10 s)")
            }
            // Cancel takes no body, but an oversized one (here chunked, undeclared) is still a 413.
            let cancel = try RawConnection(port: daemon.port)
            var chunked =
                "POST /v1/admin/recompute/1/cancel HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(APIServer.adminToken)\r\n"
            chunked += "Transfer-Encoding: chunked\r\n\r\n"
            for _ in 0..<5 { chunked += "1000\r\n" + String(repeating: " ", count: 4096) + "\r\n" }
            #expect(cancel.send(chunked + "0\r\n\r\n"))
            let cancelled = try #require(await cancel.readResponse(), "no response to a chunked cancel body")
            #expect(cancelled.hasPrefix("HTTP/1.1 413"), "\(cancelled.prefix(300))")
            await daemon.stop()
        }
    }

    // MARK: Slow and idle clients

    /// With `METRICSD_HTTP_REQUEST_TIMEOUT_SECONDS=1` and `METRICSD_HTTP_IDLE_TIMEOUT_SECONDS=2`: a connection
    /// that sends nothing, a head sent byte by byte (slowloris), a body that stalls, and an idle keep-alive
    /// connection are all closed by the server, each after its own deadline.
    @Test func slowAndIdleClientsAreDisconnected() async throws {
        try await Self.withUserAndMetrics { database in
            let daemon = try await DaemonProcess.start(
                database: database,
                extra: ["METRICSD_HTTP_REQUEST_TIMEOUT_SECONDS": "1", "METRICSD_HTTP_IDLE_TIMEOUT_SECONDS": "2"])
            let port = daemon.port
            let token = TestTokens.user(1)

            async let silent = Self.silentClient(port: port)
            async let slowloris = Self.slowlorisClient(port: port, token: token)
            async let stalledBody = Self.stalledBodyClient(port: port, token: token)
            async let idle = Self.idleKeepAliveClient(port: port)

            let silentClosed = try #require(try await silent, "a silent connection was not closed")
            #expect(silentClosed >= .milliseconds(800) && silentClosed <= .milliseconds(4000), "\(silentClosed)")

            let (slowClosed, slowBytes) = try await slowloris
            let slowAfter = try #require(slowClosed, "a slowloris connection was not closed")
            #expect(slowAfter >= .milliseconds(800) && slowAfter <= .milliseconds(4000), "\(slowAfter)")
            #expect(slowBytes == 0, "a response was sent to an incomplete head")

            let stalledClosed = try #require(try await stalledBody, "a stalled body was not closed")
            #expect(stalledClosed >= .milliseconds(800) && stalledClosed <= .milliseconds(4000), "\(stalledClosed)")

            let (served, idleClosed) = try await idle
            #expect(served, "a keep-alive connection within the idle timeout must serve")
            let idleAfter = try #require(idleClosed, "an idle keep-alive connection was not closed")
            #expect(idleAfter >= .milliseconds(1600) && idleAfter <= .milliseconds(5000), "\(idleAfter)")

            // The daemon is fine afterwards.
            #expect(try await daemon.send("/healthz").status == 200)
            await daemon.stop()
        }
    }

    /// Connects and sends nothing; how long until the server closes.
    static func silentClient(port: Int) async throws -> Duration? {
        let connection = try RawConnection(port: port)
        var received: [UInt8] = []
        return await connection.waitForClose(timeout: .seconds(6), received: &received)
    }

    /// Sends a request head one byte every 100 ms (it would take about 15 s); how long until the server closes,
    /// and how many bytes it answered.
    static func slowlorisClient(port: Int, token: String) async throws -> (Duration?, Int) {
        let connection = try RawConnection(port: port)
        let head = "GET /v1/profile/metrics/today HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\n\r\n"
        let started = ContinuousClock.now
        var received: [UInt8] = []
        for byte in head {
            guard connection.send(String(byte)) else { break }
            if case .closed = connection.readNow() { break }
            try await Task.sleep(for: .milliseconds(100))
            if ContinuousClock.now - started > .seconds(6) { break }
        }
        let rest = await connection.waitForClose(timeout: .seconds(3), received: &received)
        return (rest.map { _ in ContinuousClock.now - started }, received.count)
    }

    /// Sends a complete head announcing 100 bytes of body, then 11 bytes; how long until the server closes.
    static func stalledBodyClient(port: Int, token: String) async throws -> Duration? {
        let connection = try RawConnection(port: port)
        connection.send(
            "POST \(Self.acknowledgePath) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\n"
                + "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"version\":")
        var received: [UInt8] = []
        return await connection.waitForClose(timeout: .seconds(6), received: &received)
    }

    /// Two requests on one keep-alive connection 1.3 s apart (past the request timeout, within the idle
    /// timeout), then silence: whether both were served, and how long until the server closed after the second.
    static func idleKeepAliveClient(port: Int) async throws -> (Bool, Duration?) {
        let connection = try RawConnection(port: port)
        let request = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        connection.send(request)
        let first = await connection.readResponse()
        try await Task.sleep(for: .milliseconds(1300))
        connection.send(request)
        let second = await connection.readResponse()
        let served = first?.hasPrefix("HTTP/1.1 200") == true && second?.hasPrefix("HTTP/1.1 200") == true
        var received: [UInt8] = []
        return (served, await connection.waitForClose(timeout: .seconds(6), received: &received))
    }

    // MARK: X-Request-Id

    @Test func requestIDRoundTrip() async throws {
        try await Self.withUserAndMetrics { database in
            let daemon = try await DaemonProcess.start(database: database)
            // The daemon's catch-up writes today's row for user 1 right after the start; the acknowledgement below
            // names the latest row, so wait for it (else the ack rightly answers 404: the metrics were updated).
            let settled = await DaemonProcess.eventually(timeout: .seconds(30)) {
                (try? await database.value(
                    "SELECT count(*) FILTER (WHERE state = 'done') > 0 AND count(*) FILTER (WHERE state <> 'done') = 0 FROM daily_units"
                )) == "t"
            }
            try #require(settled, "the daily catch-up did not finish:\n\(daemon.log.suffix(2000))")
            let user = TestTokens.bearer(TestTokens.user(1))
            let admin = TestTokens.bearer(APIServer.adminToken)
            let big = String(repeating: "x", count: 17 * 1024)
            let current = try await daemon.send("/v1/profile/metrics/today", headers: user)
            let computedAt = try #require(current.json?["data"]?["metrics"]?["computedAt"]?.string, "\(current)")
            let ack = #"{"version":1,"metricsComputedAt":"\#(computedAt)"}"#
            // A trigger makes a job (202) only when user 1 lacks today's row (the daily unit ran for yesterday, between
            // 00:00 and the daily time); else there is nothing to do (200).
            let hasToday = try await database.value(
                "SELECT count(*) FROM profile_metrics WHERE user_id = 1 AND metrics_date = (now() AT TIME ZONE 'UTC')::date"
            )
            let trigger = hasToday == "1" ? 200 : 202
            // (method, path, headers, body, status)
            let requests: [(HTTPRequest.Method, String, HTTPFields, String?, Int)] = [
                (.get, "/healthz", [:], nil, 200), (.get, "/readyz", [:], nil, 200),
                (.get, "/openapi.yaml", [:], nil, 200),
                (.get, "/metrics", [:], nil, 200), (.get, "/v1/profile/metrics/today", user, nil, 200),
                (.post, Self.acknowledgePath, user, ack, 200), (.post, Self.acknowledgePath, user, "{", 400),
                (.get, "/v1/profile/metrics/today", [:], nil, 401), (.get, "/v1/admin/recompute", user, nil, 401),
                (.get, "/no/such/route", [:], nil, 404), (.get, "/v1/admin/recompute/999", admin, nil, 404),
                (.delete, "/v1/profile/metrics/today", user, nil, 405), (.post, Self.acknowledgePath, user, big, 413),
                (.post, "/v1/admin/recompute", admin, nil, trigger),
                (.post, "/v1/admin/recompute/x/cancel", admin, nil, 400),
            ]
            var generated: Set<String> = []
            for (index, (method, path, headers, body, status)) in requests.enumerated() {
                // A well-formed client id comes back unchanged.
                let id = "client-\(index)_A.z"
                let echoed = try await daemon.send(
                    path, method: method, headers: headers.merging([HTTPField.Name("X-Request-Id")!: id]), body: body)
                #expect(echoed.status == status, "\(method) \(path): \(echoed)")
                #expect(echoed.requestID == id, "\(method) \(path): \(String(describing: echoed.requestID))")
                // Without one, or with a malformed one, the server makes its own.
                let malformed = [
                    nil, "", String(repeating: "a", count: 65), "has space", "semi;colon", "ünïcödé", "a/b", "<script>",
                    "x@y",
                ][index % 9]
                let own = try await daemon.send(
                    path, method: method,
                    headers: malformed.map { headers.merging([HTTPField.Name("X-Request-Id")!: $0]) } ?? headers,
                    body: body)
                let ownID = try #require(own.requestID, "\(method) \(path) has no X-Request-Id")
                #expect(ownID != malformed, "\(method) \(path) echoed a malformed id")
                #expect(ownID.wholeMatch(of: #/[0-9a-f]{16}/#) != nil, "\(ownID)")
                generated.insert(ownID)
                if own.status >= 400 { expectErrorBody(own, status: own.status) }
            }
            #expect(generated.count == requests.count, "generated ids repeat")
            // The longest well-formed id, 64 characters of every allowed kind.
            let longest = String(repeating: "aZ9._-", count: 11).prefix(64)
            let reply = try await daemon.send("/healthz", headers: [HTTPField.Name("X-Request-Id")!: String(longest)])
            #expect(reply.requestID == String(longest))
            await daemon.stop()
        }
    }

    // MARK: Malformed and hostile input

    /// Hand-picked hostile bodies, paths and headers, then a seeded random fuzz of acknowledgement bodies: never a
    /// 5xx, always the documented error bodies, nothing leaked, nothing changed in the database but acknowledgements.
    @Test func hostileInputIs4xxNever5xx() async throws {
        try await Self.withUserAndMetrics { database in
            try await APIServer.run(database: database) { port in
                var replies: [(String, APIReply)] = []
                func send(
                    _ name: String, _ path: String, method: HTTPRequest.Method = .get,
                    headers: HTTPFields = Self.userHeaders,
                    body: ByteBuffer? = nil
                ) async throws -> APIReply {
                    let reply = try await API.send(port: port, path, method: method, headers: headers, body: body)
                    replies.append((name, reply))
                    return reply
                }

                // Bodies that are not JSON, not UTF-8, or nested beyond reason.
                let rawBodies: [(String, [UInt8])] = [
                    ("invalid UTF-8", [0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]),
                    ("NUL bytes", [0, 0, 0, 0]),
                    ("UTF-16", Array("{\"version\":1}".utf16.flatMap { [UInt8($0 & 0xff), UInt8($0 >> 8)] })),
                    (
                        "BOM",
                        [0xef, 0xbb, 0xbf]
                            + Array(#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)
                    ),
                    (
                        "deep arrays",
                        Array((String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000)).utf8)
                    ),
                    (
                        "deep objects",
                        Array(
                            (String(repeating: #"{"a":"#, count: 2500) + "1" + String(repeating: "}", count: 2500)).utf8
                        )
                    ),
                    (
                        "deep version",
                        Array(
                            ("{\"version\":" + String(repeating: "[", count: 3000) + String(repeating: "]", count: 3000)
                                + "}").utf8)
                    ),
                    (
                        "raw control characters",
                        Array("{\"version\":1,\"metricsComputedAt\":\"2025-10-29T14:30:45.123Z\u{1}\u{8}\"}".utf8)
                    ),
                    (
                        "raw newline in string",
                        Array("{\"version\":1,\"metricsComputedAt\":\"2025-10-29\nT14:30:45.123Z\"}".utf8)
                    ),
                    (
                        "long string",
                        Array(
                            ("{\"version\":1,\"metricsComputedAt\":\"" + String(repeating: "9", count: 15000) + "\"}")
                                .utf8)
                    ),
                    ("long number", Array(("{\"version\":" + String(repeating: "9", count: 15000) + "}").utf8)),
                    ("many keys", Array(("{" + (0..<1500).map { "\"k\($0)\":1" }.joined(separator: ",") + "}").utf8)),
                    ("lone surrogate", Array(#"{"version":1,"metricsComputedAt":"\ud800"}"#.utf8)),
                    ("escaped NUL", Array(#"{"version":1,"metricsComputedAt":"\u0000"}"#.utf8)),
                    ("SQL", Array(#"{"version":"1); DELETE FROM profile_metrics; --","metricsComputedAt":"x"}"#.utf8)),
                    (
                        "SQL date",
                        Array(#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z' OR 1=1 --"}"#.utf8)
                    ),
                    (
                        "SQL key",
                        Array(#"{"version; DROP TABLE users":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)
                    ),
                    ("NaN literal", Array(#"{"version":NaN,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)),
                    (
                        "Infinity literal",
                        Array(#"{"version":Infinity,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)
                    ),
                    ("hex number", Array(#"{"version":0x1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)),
                    ("leading zero", Array(#"{"version":01,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)),
                    ("tiny float", Array(#"{"version":1e-400,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)),
                    ("negative zero", Array(#"{"version":-0,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#.utf8)),
                    ("huge year", Array(#"{"version":1,"metricsComputedAt":"99999-10-29T14:30:45.123Z"}"#.utf8)),
                    ("year zero", Array(#"{"version":1,"metricsComputedAt":"0000-01-01T00:00:00.000Z"}"#.utf8)),
                    ("far offset", Array(#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123+99:99"}"#.utf8)),
                    (
                        "trailing garbage",
                        Array(#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}garbage"#.utf8)
                    ),
                    ("two objects", Array(#"{"version":1}{"version":1}"#.utf8)),
                ]
                for (name, bytes) in rawBodies {
                    let reply = try await send(
                        name, Self.acknowledgePath, method: .post, body: ByteBuffer(bytes: bytes))
                    // RFC 8259 lets a parser ignore a byte order mark.
                    #expect(reply.status == 400 || (name == "BOM" && reply.status == 200), "\(name): \(reply)")
                }

                // Hostile paths, queries and headers.
                let admin = TestTokens.bearer(APIServer.adminToken)
                let paths: [(String, HTTPFields, Set<Int>)] = [
                    ("/v1/admin/recompute/1%27%20OR%20%271%27=%271", admin, [400]),
                    ("/v1/admin/recompute/99999999999999999999", admin, [400]),
                    ("/v1/admin/recompute/-1", admin, [400]),
                    ("/v1/admin/recompute/0", admin, [400]), ("/v1/admin/recompute/NaN", admin, [400]),
                    ("/v1/admin/recompute/1e3", admin, [400]), ("/v1/admin/recompute/%00", admin, [400, 404]),
                    ("/v1/admin/recompute/1;DROP%20TABLE%20users", admin, [400]),
                    ("/v1/admin/recompute/" + String(repeating: "9", count: 2000), admin, [400]),
                    ("/v1/profile/metrics/today?user_id=2%20OR%201=1", Self.userHeaders, [200]),
                    ("/v1/profile/metrics/today/../../admin/recompute", Self.userHeaders, [401, 404]),
                    ("/v1/profile/metrics/%2e%2e/%2e%2e/admin/recompute", Self.userHeaders, [404]),
                    ("/" + String(repeating: "a/", count: 1500), [:], [404]),
                    ("/%ff%fe%00", [:], [404]), ("/v1/profile/metrics/today%00", Self.userHeaders, [404]),
                    (
                        "/v1/profile/metrics/today",
                        [.authorization: "Bearer " + String(repeating: "A", count: 10_000)], [401]
                    ),
                    ("/v1/profile/metrics/today", [.authorization: "Bearer ' OR '1'='1"], [401]),
                    ("/v1/profile/metrics/today", [.authorization: "Bearer a.b.c"], [401]),
                    ("/v1/profile/metrics/today", [.authorization: "Bearer ....."], [401]),
                    ("/v1/profile/metrics/today", [.authorization: "Bearer \(TestTokens.user(1)) extra"], [401]),
                    ("/v1/admin/recompute", [.authorization: "Bearer " + APIServer.adminToken + "x"], [401]),
                    (
                        "/v1/admin/recompute", [.authorization: "Bearer " + String(APIServer.adminToken.dropLast())],
                        [401]
                    ),
                ]
                for (path, headers, statuses) in paths {
                    let reply = try await send(path, path, headers: headers)
                    #expect(statuses.contains(reply.status), "\(path.prefix(80)): \(reply)")
                }
                // The admin trigger takes no body or a JSON object (options, reserved); any other JSON is a 400.
                for body in ["[null, null]", "[]", "1", "\"x\"", "null", "true", "{", "{}}", "\u{0}"] {
                    let reply = try await send(
                        "trigger \(body)", "/v1/admin/recompute", method: .post, headers: admin,
                        body: ByteBuffer(string: body))
                    #expect(reply.status == 400, "trigger body \(body): \(reply)")
                }
                #expect(try await database.value("SELECT count(*) FROM recompute_jobs") == "0")
                for body in ["", "{}", #"{"dryRun":false}"#] {
                    let reply = try await send(
                        "trigger \(body)", "/v1/admin/recompute", method: .post, headers: admin,
                        body: ByteBuffer(string: body))
                    #expect(reply.status == 202 || reply.status == 200, "trigger body \(body): \(reply)")
                }

                // The query string never selects another user.
                let other = try #require(replies.first { $0.0.contains("user_id") }?.1.json)
                #expect(other["data"]?["metrics"]?["computedAt"] == .string(Self.computedAt))

                // A seeded fuzz of acknowledgement bodies: valid JSON with hostile values, and mangled text.
                var random = SplitMix64(seed: 0x6d65_7472_6963_7364)
                let values: [String] = [
                    "1", "2", "0", "-1", "1.5", "1e400", "-1e400", "1e-400", "2147483647", "2147483648",
                    "9223372036854775808",
                    "1e19", "\"1\"", "\"NaN\"", "\"Infinity\"", "\"-Infinity\"", "true", "false", "null", "[]", "{}",
                    "[1]",
                    "{\"$gt\":0}", "\"' OR 1=1 --\"", "\"1; DROP TABLE users\"", "\"\\u0000\"", "\"\\n\\r\\t\"",
                    "\"%00\"",
                    "\"\(Self.computedAt)\"", "\"2025-10-29T14:30:45.123+00:00\"", "\"2025-10-29T14:30:45Z\"",
                    "\"2025-10-29\"", "\"\"", "\"\\ud83d\\ude00\"", "\"𝕏\"", "\"2025-02-29T00:00:00Z\"",
                    "\"9999-12-31T23:59:59.999Z\"", "\"0001-01-01T00:00:00Z\"", "\"2025-10-29T14:30:45.123456789Z\"",
                    "\"2025-10-29T14:30:45.1234567891Z\"", "\"${jndi:ldap://x}\"", "\"{{7*7}}\"",
                ]
                let keys = [
                    "version", "metricsComputedAt", "Version", "version ", "metrics_computed_at", "__proto__", "",
                ]
                var fuzzStatuses: [Int: Int] = [:]
                let fuzzCount = 600
                for index in 0..<fuzzCount {
                    var body: String
                    let pairs = (0..<random.next(upTo: 4)).map { _ in
                        "\"\(keys[random.next(upTo: keys.count)])\":\(values[random.next(upTo: values.count)])"
                    }
                    body = "{" + pairs.joined(separator: ",") + "}"
                    if random.next(upTo: 3) == 0 {
                        // Mangle: delete, duplicate or replace a few characters.
                        var scalars = Array(body.unicodeScalars)
                        for _ in 0..<(1 + random.next(upTo: 3)) where !scalars.isEmpty {
                            let at = random.next(upTo: scalars.count)
                            switch random.next(upTo: 3) {
                            case 0: scalars.remove(at: at)
                            case 1: scalars.insert(scalars[at], at: at)
                            default:
                                scalars[at] =
                                    ["{", "}", "\"", ":", ",", "\\", "\u{0}", "\u{7f}", "[", "é"][random.next(upTo: 10)]
                            }
                        }
                        body = String(String.UnicodeScalarView(scalars))
                    }
                    let reply = try await send(
                        "fuzz \(index): \(body)", Self.acknowledgePath, method: .post, body: ByteBuffer(string: body))
                    fuzzStatuses[reply.status, default: 0] += 1
                    #expect([200, 400, 404].contains(reply.status), "fuzz \(index) \(body): \(reply)")
                    if reply.status == 200 {
                        #expect(reply.json?["data"]?["acknowledged"] == .bool(true), "\(body): \(reply)")
                    }
                }
                #expect((fuzzStatuses[400] ?? 0) > fuzzCount / 2, "\(fuzzStatuses)")

                // Never a 5xx; every error is the documented error body with a request id; nothing leaks anywhere.
                for (name, reply) in replies {
                    #expect(reply.status < 500, "\(name.prefix(200)): \(reply)")
                    if reply.status >= 400 { expectErrorBody(reply, status: reply.status) } else { expectNoLeak(reply) }
                }
                // Nothing was dropped or rewritten.
                #expect(try await database.value("SELECT count(*) FROM users") == "1")
                #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "1")
                #expect(try await database.value("SELECT count(*) FROM recompute_jobs") == "1")
                #expect(Int(try await database.value("SELECT count(*) FROM metrics_acknowledgements") ?? "") ?? 9 <= 1)
            }
        }
    }

    // MARK: Real faults

    /// A store that fails the way a broken deployment would: an unexpected SQL error whose message holds SQL,
    /// a path and a secret.
    struct FailingStore: MetricsStore {
        static let detail =
            #"syntax error at or near "FROM" in SELECT bmi FROM profile_metrics WHERE user_id = $1 (/work/main/Sources/MetricsdPostgres/SQL.swift:42) password=s3cr3t"#

        func latestMetrics(userID: Int64) async throws -> LatestMetrics? {
            throw PostgresError(code: .queryFailed, message: Self.detail, sqlState: "42601")
        }
        func latestMetrics(userID: Int64, completion: @escaping @Sendable (Result<LatestMetrics?, any Error>) -> Void) {
            completion(.failure(PostgresError(code: .queryFailed, message: Self.detail, sqlState: "42601")))
        }
        func computeNow(userID: Int64) async throws -> ComputeNowOutcome {
            throw PostgresError(code: .unexpectedResult, message: Self.detail)
        }
        func acknowledge(userID: Int64, version: Int, computedAt: Timestamp) async throws -> AcknowledgeOutcome {
            struct Boom: Error, CustomStringConvertible { var description: String { FailingStore.detail } }
            throw Boom()
        }
        func readiness() async -> Readiness {
            Readiness(database: .unreachable, schema: .unknown, reason: "database unreachable: injected")
        }
    }

    @Test func serverFaultIs500WithTheRequestIDInBodyHeaderAndLog() async throws {
        let (logger, logs) = CapturingLogHandler.logger()
        try await APIServer.run(store: FailingStore(), logger: logger) { port in
            let user = TestTokens.bearer(TestTokens.user(1))
            let ack = #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#
            // The 500's log line carries the cause's own code when it has one (a statement the server refused),
            // else the 500's; the body always the 500's.
            for (path, method, body, clientID, loggedCode) in [
                (
                    "/v1/profile/metrics/today", HTTPRequest.Method.get, nil as String?, "trace-500-today" as String?,
                    "database.query_failed"
                ),
                (Self.acknowledgePath, .post, ack, "trace-500-ack", "server.internal"),
                ("/v1/profile/metrics/today", .get, nil, nil, "database.query_failed"),
            ] {
                var headers = user
                if let clientID { headers[HTTPField.Name("X-Request-Id")!] = clientID }
                let reply = try await API.send(
                    port: port, path, method: method, headers: headers, body: body.map { ByteBuffer(string: $0) })
                let message = expectErrorBody(reply, status: 500, code: .internalError)
                expectNoLeak(reply, secrets: ["s3cr3t", "42601", "syntax", "SQL.swift"])
                let id = try #require(reply.requestID)
                if let clientID { #expect(id == clientID) }
                #expect(message.contains(id), "the body names the request id: \(message)")
                // The details are in the log, under the same id.
                let logged = logs.all.filter { $0.level >= .error && $0.metadata["metricsd.request.id"] == id }
                #expect(logged.count == 1, "\(logs.all.map { "\($0.level) \($0.message) \($0.metadata)" })")
                #expect(logged.first?.metadata["metricsd.error"]?.contains("syntax error") == true)
                #expect(logged.first?.metadata["metricsd.error.code"] == loggedCode, "\(path)")
            }
            // Readiness is not a fault of the request: 503, not 500.
            #expect(try await API.send(port: port, "/readyz").status == 503)
        }
    }

    // MARK: Database down

    /// In-process, against a pool whose server is not there: every database route is 503 with `Retry-After`.
    @Test func databaseDownIs503WithRetryAfter() async throws {
        let url = "postgresql://postgres@127.0.0.1:\(DaemonProcess.freePort())/none?connect_timeout=2"
        let logger = APIServer.quietLogger
        let pool = PostgresPool(
            settings: try ConnectionSettings(conninfo: url, environment: [:]), configuration: .init(size: 2),
            logger: logger)
        let store = PostgresStore(pool: pool, formula: .current, logger: logger)
        try await APIServer.run(store: store, jobs: RecomputeJobs(pool: pool)) { port in
            try await Self.expectUnavailable(port: port)
        }
        await pool.close()
    }

    /// The real daemon while its database refuses connections (existing ones terminated, new ones refused), then
    /// serving again once the database is back, with no restart.
    @Test func daemonAnswers503WhileTheDatabaseIsUnavailable() async throws {
        try await Self.withUserAndMetrics { database in
            let daemon = try await DaemonProcess.start(database: database)
            #expect(try await daemon.send("/v1/profile/metrics/today", headers: Self.userHeaders).status == 200)
            await database.pool.close()
            try await TestDatabase.admin { connection in
                try connection.execute("ALTER DATABASE \(database.name) WITH ALLOW_CONNECTIONS false")
                try connection.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(database.name)' AND pid <> pg_backend_pid()"
                )
            }
            try await Self.expectUnavailable(port: daemon.port)
            try await TestDatabase.admin { connection in
                try connection.execute("ALTER DATABASE \(database.name) WITH ALLOW_CONNECTIONS true")
            }
            let back = try await DaemonProcess.eventually(timeout: .seconds(20)) {
                try await daemon.send("/v1/profile/metrics/today", headers: Self.userHeaders).status == 200
            }
            #expect(back, "the daemon did not recover; output:\n\(daemon.log.suffix(2000))")
            await daemon.stop()
        }
    }

    static func expectUnavailable(port: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let admin = TestTokens.bearer(APIServer.adminToken)
        let ack = #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z"}"#
        for (path, method, headers, body) in [
            ("/v1/profile/metrics/today", HTTPRequest.Method.get, Self.userHeaders, nil as String?),
            (Self.acknowledgePath, .post, Self.userHeaders, ack),
            ("/v1/admin/recompute", .get, admin, nil), ("/v1/admin/recompute", .post, admin, nil),
            ("/v1/admin/recompute/1", .get, admin, nil),
        ] {
            let started = ContinuousClock.now
            let reply = try await API.send(
                port: port, path, method: method, headers: headers, body: body.map { ByteBuffer(string: $0) })
            expectErrorBody(reply, status: 503, codes: AppError.Code.databaseCodes, sourceLocation: sourceLocation)
            #expect(
                reply.headers[.retryAfter].flatMap { Int($0) }.map { $0 > 0 } == true,
                "\(method) \(path): Retry-After \(String(describing: reply.headers[.retryAfter]))",
                sourceLocation: sourceLocation)
            // Fast, not a hang (generous: the whole test suite may be loading the machine).
            #expect(
                ContinuousClock.now - started < .seconds(15), "\(method) \(path) took too long",
                sourceLocation: sourceLocation)
        }
        // /readyz may answer from its last probe for up to a second (it says so in `ageSeconds`), then 503.
        let notReady = try await DaemonProcess.eventually(timeout: .seconds(3)) {
            try await API.send(port: port, "/readyz").status == 503
        }
        #expect(notReady, "/readyz did not turn 503 within a second of its last probe", sourceLocation: sourceLocation)
        #expect(try await API.send(port: port, "/healthz").status == 200, sourceLocation: sourceLocation)
    }
}
