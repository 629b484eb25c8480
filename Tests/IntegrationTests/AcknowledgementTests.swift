import Foundation
import HTTPTypes
import HealthMetrics
import Logging
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdTestSupport
import MetricsdWork
import Testing

/// `POST /v1/profile/metrics/acknowledge` over real HTTP against the real database, and what
/// `GET …/today` then says, through every way a row can change (daily job, settings change, recompute-all).
@Suite struct AcknowledgementTests {
    static let updated = "Your metrics have been updated. Please refresh and try again."

    /// The current metrics as GET shows them: (version, computedAt, data).
    static func current(port: Int, user: Int64, sourceLocation: SourceLocation = #_sourceLocation) async throws
        -> (version: Int, computedAt: String, data: JSONValue)
    {
        let data = try LatestMetricsHTTPTests.expectTodayShape(
            try await API.today(port: port, user: user), sourceLocation: sourceLocation)
        let version = try #require(data["metrics"]?["version"]?.int, sourceLocation: sourceLocation)
        let computedAt = try #require(data["metrics"]?["computedAt"]?.string, sourceLocation: sourceLocation)
        return (Int(version), computedAt, data)
    }

    /// Checks a 200 acknowledgement body field for field; returns `acknowledgedAt`.
    static func expectAcknowledged(_ reply: APIReply, version: Int, sourceLocation: SourceLocation = #_sourceLocation)
        throws -> String
    {
        #expect(reply.status == 200, "\(reply)", sourceLocation: sourceLocation)
        #expect(reply.headers[.contentType]?.hasPrefix("application/json") == true, sourceLocation: sourceLocation)
        let body = try #require(reply.json, "\(reply)", sourceLocation: sourceLocation)
        #expect(body.keys == ["success", "data"], sourceLocation: sourceLocation)
        #expect(body["success"] == .bool(true), sourceLocation: sourceLocation)
        #expect(body["data"]?.keys == ["acknowledged", "acknowledgement"], sourceLocation: sourceLocation)
        #expect(body["data"]?["acknowledged"] == .bool(true), sourceLocation: sourceLocation)
        let acknowledgement = try #require(body["data"]?["acknowledgement"], sourceLocation: sourceLocation)
        #expect(acknowledgement.keys == ["acknowledgedAt", "version"], sourceLocation: sourceLocation)
        #expect(acknowledgement["version"] == .number(Double(version)), sourceLocation: sourceLocation)
        let at = try #require(acknowledgement["acknowledgedAt"]?.string, sourceLocation: sourceLocation)
        #expect(isISOMilliseconds(at), "acknowledgedAt \(at)", sourceLocation: sourceLocation)
        return at
    }

    @Test func acknowledgeIsIdempotentAndShowsInToday() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await APIServer.run(database: database) { port in
                let (version, computedAt, before) = try await Self.current(port: port, user: 1)
                #expect(before["acknowledged"] == .bool(false))
                let first = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: version, computedAt: computedAt),
                    version: version)
                // Not before the metrics it acknowledges, and not in the future.
                let firstInstant = try #require(Timestamp(iso8601: first))
                #expect(firstInstant >= Timestamp(iso8601: computedAt)!)
                try await Task.sleep(for: .milliseconds(20))
                let second = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: version, computedAt: computedAt),
                    version: version)
                #expect(second == first, "acknowledging twice keeps the first acknowledgedAt")
                let (_, sameComputedAt, after) = try await Self.current(port: port, user: 1)
                #expect(sameComputedAt == computedAt)
                #expect(after["acknowledged"] == .bool(true))
                #expect(
                    after["acknowledgement"]
                        == .object(["acknowledgedAt": .string(first), "version": .number(Double(version))]))
                #expect(after["metrics"] == before["metrics"])
                #expect(try await database.value("SELECT count(*) FROM metrics_acknowledgements") == "1")
            }
        }
    }

    @Test func concurrentFirstAcknowledgementsAgreeOnOneInstant() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await APIServer.run(database: database) { port in
                let (version, computedAt, _) = try await Self.current(port: port, user: 1)
                let replies = try await withThrowingTaskGroup(of: APIReply.self) { group in
                    for _ in 0..<10 {
                        group.addTask {
                            try await API.acknowledge(port: port, user: 1, version: version, computedAt: computedAt)
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                let instants = try Set(replies.map { try Self.expectAcknowledged($0, version: version) })
                #expect(instants.count == 1, "\(instants)")
            }
        }
    }

    @Test func sameInstantWrittenDifferentlyIsAccepted() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(user: 1, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database) { port in
                let first = try Self.expectAcknowledged(
                    try await API.acknowledge(
                        port: port, user: 1, version: 1, computedAt: "2025-10-29T14:30:45.123+00:00"),
                    version: 1)
                for text in [
                    "2025-10-29T14:30:45.123Z", "2025-10-29T20:15:45.123+05:45", "2025-10-29T09:30:45.123-05:00",
                    "2025-10-29T14:30:45.123000Z", "2025-10-29t14:30:45.123z", "2025-10-29T14:30:45.123000000-00:00",
                ] {
                    let at = try Self.expectAcknowledged(
                        try await API.acknowledge(port: port, user: 1, version: 1, computedAt: text), version: 1)
                    #expect(at == first, "\(text)")
                }
                // One millisecond off is other metrics.
                for text in ["2025-10-29T14:30:45.122Z", "2025-10-29T14:30:45.124Z", "2025-10-29T14:30:45Z"] {
                    expectErrorBody(
                        try await API.acknowledge(port: port, user: 1, version: 1, computedAt: text), status: 404,
                        code: .stale, contains: [Self.updated])
                }
            }
        }
    }

    /// The daily job writes the new local date's row: yesterday's acknowledgement no longer applies.
    @Test func dailyJobOnANewDayUnacknowledges() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(
                user: 1, bmi: "22.9", bmr: 1482, tdee: 2297, date: "2025-10-28", computedAt: "2025-10-28T00:05:00.000Z")
            try await APIServer.run(database: database) { port in
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: 1, computedAt: "2025-10-28T00:05:00.000Z"),
                    version: 1)
                #expect(try await Self.current(port: port, user: 1).data["acknowledged"] == .bool(true))

                try await Self.runDaily(database, at: "2025-10-29T00:10:00Z")

                let (version, computedAt, data) = try await Self.current(port: port, user: 1)
                #expect(computedAt == "2025-10-29T00:10:00.000Z")
                #expect(data["acknowledged"] == .bool(false))
                #expect(data["acknowledgement"] == .null)
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 1, version: 1, computedAt: "2025-10-28T00:05:00.000Z"),
                    status: 404, code: .stale)
                #expect(
                    try Self.expectAcknowledged(
                        try await API.acknowledge(port: port, user: 1, version: version, computedAt: computedAt),
                        version: 1) != "")
                #expect(try await Self.current(port: port, user: 1).data["acknowledged"] == .bool(true))
            }
        }
    }

    /// The daily job reruns a date (e.g. resumed after a crash): changed values unacknowledge, unchanged values
    /// leave the row, its `computed_at` and its acknowledgement alone.
    @Test func dailyRecomputeUnacknowledgesOnlyWhenValuesChange() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            // Both rows hold exactly what formula 1 gives for their settings on 2025-10-29.
            let settings = RawSettings(
                dateOfBirth: "1990-05-17", gender: "female", weightKilograms: "70.00", heightCentimetres: "175.0",
                activityLevel: "moderately_active")
            guard
                case .computed(let metrics) = MetricsFormula.current.evaluate(
                    settings, on: LocalDate(iso: "2025-10-29")!)
            else {
                Issue.record("seed settings are invalid")
                return
            }
            for user: Int64 in [1, 2] {
                try await database.insertMetrics(
                    user: user, bmi: metrics.bmi.description, bmr: Int(metrics.bmr), tdee: Int(metrics.tdee),
                    date: "2025-10-29", computedAt: "2025-10-29T00:05:00.000Z")
            }
            try await APIServer.run(database: database) { port in
                for user: Int64 in [1, 2] {
                    _ = try Self.expectAcknowledged(
                        try await API.acknowledge(
                            port: port, user: user, version: 1, computedAt: "2025-10-29T00:05:00.000Z"),
                        version: 1)
                }
                // User 2's weight changed; the change notification was lost, so only the daily run sees it.
                try await database.execute("UPDATE user_settings SET current_weight = 75.5 WHERE user_id = 2")
                try await Self.runDaily(database, at: "2025-10-29T00:10:00Z")

                let unchanged = try await Self.current(port: port, user: 1)
                #expect(unchanged.computedAt == "2025-10-29T00:05:00.000Z")
                #expect(unchanged.data["acknowledged"] == .bool(true))

                let changed = try await Self.current(port: port, user: 2)
                #expect(changed.computedAt == "2025-10-29T00:10:00.000Z")
                #expect(changed.data["metrics"]?["bmi"] == .number(24.7))
                #expect(changed.data["acknowledged"] == .bool(false))
                #expect(changed.data["acknowledgement"] == .null)
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 2, version: 1, computedAt: "2025-10-29T00:05:00.000Z"),
                    status: 404, code: .stale)
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 2, version: 1, computedAt: changed.computedAt),
                    version: 1)
            }
        }
    }

    /// A settings change recomputes today's row (`WorkQueue.refreshUsers`, what the settings listener runs).
    @Test func settingsChangeUnacknowledges() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await APIServer.run(database: database) { port in
                let (version, computedAt, _) = try await Self.current(port: port, user: 1)
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: version, computedAt: computedAt),
                    version: version)
                try await database.execute(
                    "UPDATE user_settings SET current_weight = 71.00, updated_at = now() WHERE user_id = 1")
                let written = try await Self.queue(database).refreshUsers([1])
                #expect(written == 1)
                let after = try await Self.current(port: port, user: 1)
                #expect(after.computedAt > computedAt)
                #expect(after.data["acknowledged"] == .bool(false))
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 1, version: version, computedAt: computedAt),
                    status: 404,
                    code: .stale)
            }
        }
    }

    /// Recompute-all after a formula bump (triggered over the admin API, processed by the work queue of a
    /// version-2 build): acknowledging the version-1 metrics is a 404, the version-2 ones a 200.
    @Test func recomputeAllAfterAVersionBumpUnacknowledges() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...5).map { SeedUser.valid(Int64($0)) })
            let version1 = try await APIServer.run(database: database) { port in
                let (version, computedAt, _) = try await Self.current(port: port, user: 1)
                #expect(version == 1)
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: 1, computedAt: computedAt), version: 1)
                return computedAt
            }
            let bumped = MetricsFormula.rehearsal(version: 2)
            try await APIServer.run(database: database, formula: bumped) { port in
                let admin = TestTokens.bearer(APIServer.adminToken)
                let trigger = try await API.send(port: port, "/v1/admin/recompute", method: .post, headers: admin)
                #expect(trigger.status == 202, "\(trigger)")
                let jobID = try #require(trigger.json?["data"]?["job"]?["id"]?.int)
                let queue = Self.queue(database, formula: bumped)
                while let chunk = try await queue.claim() { _ = try await queue.process(chunk) }
                _ = try await queue.finishCompleted()
                let job = try await API.send(port: port, "/v1/admin/recompute/\(jobID)", headers: admin)
                #expect(job.json?["data"]?["job"]?["state"] == .string("done"), "\(job)")
                #expect(job.json?["data"]?["job"]?["usersExamined"] == .number(5), "\(job)")
                #expect(job.json?["data"]?["job"]?["usersWritten"] == .number(5), "\(job)")

                let (version, computedAt, data) = try await Self.current(port: port, user: 1)
                #expect(version == 2)
                #expect(data["acknowledged"] == .bool(false))
                // The version-1 metrics, even with their exact instant, are no longer current.
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 1, version: 1, computedAt: version1), status: 404,
                    code: .stale)
                // Version 2 with the old instant is not the current metrics either.
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 1, version: 2, computedAt: version1), status: 404,
                    code: .stale)
                // Version 1 with the new instant neither.
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 1, version: 1, computedAt: computedAt), status: 404,
                    code: .stale)
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: 2, computedAt: computedAt), version: 2)
                let after = try await Self.current(port: port, user: 1)
                #expect(after.data["acknowledged"] == .bool(true))
                #expect(after.data["acknowledgement"]?["version"] == .number(2))
            }
        }
    }

    /// The real daemon end to end: acknowledge, then a settings change that the daemon's own listener turns into
    /// a recompute, then a restart as a version-2 build and a recompute-all over the admin API.
    @Test func daemonRecomputesAndTheAcknowledgementLapses() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            let daemon = try await DaemonProcess.start(database: database)
            try await Self.settle(database, daemon)
            let bearer = TestTokens.bearer(TestTokens.user(1))
            func today(_ daemon: DaemonProcess) async throws -> JSONValue {
                try LatestMetricsHTTPTests.expectTodayShape(
                    try await daemon.send("/v1/profile/metrics/today", headers: bearer))
            }
            func acknowledge(_ daemon: DaemonProcess, _ version: Int, _ computedAt: String) async throws -> APIReply {
                try await daemon.send(
                    "/v1/profile/metrics/acknowledge", method: .post, headers: bearer,
                    body: #"{"version":\#(version),"metricsComputedAt":"\#(computedAt)"}"#)
            }
            let first = try #require(try await today(daemon)["metrics"]?["computedAt"]?.string)
            _ = try Self.expectAcknowledged(try await acknowledge(daemon, 1, first), version: 1)
            #expect(try await today(daemon)["acknowledged"] == .bool(true))

            try await database.execute("UPDATE user_settings SET height = 180.0, updated_at = now() WHERE user_id = 1")
            let lapsed = try await DaemonProcess.eventually(timeout: .seconds(20)) {
                try await today(daemon)["acknowledged"] == .bool(false)
            }
            #expect(
                lapsed, "the daemon did not recompute after the settings change; output:\n\(daemon.log.suffix(2000))")
            let second = try #require(try await today(daemon)["metrics"]?["computedAt"]?.string)
            #expect(second != first)
            expectErrorBody(try await acknowledge(daemon, 1, first), status: 404, code: .stale)
            _ = try Self.expectAcknowledged(try await acknowledge(daemon, 1, second), version: 1)
            await daemon.stop()

            let bumped = try await DaemonProcess.start(
                database: database, extra: ["METRICSD_TEST_FORMULA_VERSION": "2"])
            let trigger = try await bumped.send(
                "/v1/admin/recompute", method: .post, headers: TestTokens.bearer(APIServer.adminToken))
            // 202, or 200 when the version-2 daily unit has already given every user their row (nothing to do).
            #expect(trigger.status == 202 || trigger.status == 200, "\(trigger)")
            let recomputed = try await DaemonProcess.eventually(timeout: .seconds(30)) {
                try await today(bumped)["metrics"]?["version"] == .number(2)
            }
            #expect(recomputed, "no version-2 row; output:\n\(bumped.log.suffix(2000))")
            try await Self.settle(database, bumped)
            let third = try await today(bumped)
            #expect(third["acknowledged"] == .bool(false))
            expectErrorBody(try await acknowledge(bumped, 1, second), status: 404, code: .stale)
            let computedAt = try #require(third["metrics"]?["computedAt"]?.string)
            _ = try Self.expectAcknowledged(try await acknowledge(bumped, 2, computedAt), version: 2)
            await bumped.stop()
        }
    }

    /// A user who never had metrics gets a 404 that says there are none yet and why (the same words as the
    /// read), never "updated"; and nothing is written.
    @Test func userWithoutMetricsGets404SayingWhy() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser(id: 1, height: "72.0"), .valid(2)])
            try await APIServer.run(database: database) { port in
                let invalid = try await API.acknowledge(
                    port: port, user: 1, version: 1, computedAt: "2025-10-29T14:30:45.123Z")
                expectErrorBody(invalid, status: 404, code: .settingsInvalid, contains: ["height 72"])
                let unknown = try await API.acknowledge(
                    port: port, user: 404, version: 1, computedAt: "2025-10-29T14:30:45.123Z")
                expectErrorBody(unknown, status: 404, code: .userUnknown)
                let notYet = try await API.acknowledge(
                    port: port, user: 2, version: 1, computedAt: "2025-10-29T14:30:45.123Z")
                expectErrorBody(notYet, status: 404, code: .notComputedYet)
                // The read says the same about the invalid user.
                expectErrorBody(
                    try await API.today(port: port, user: 1), status: 404, code: .settingsInvalid,
                    contains: ["height 72"])
                #expect(try await database.value("SELECT count(*) FROM metrics_acknowledgements") == "0")
                #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE user_id = 2") == "0")
            }
        }
    }

    /// Another user's metrics are never acknowledged by this user.
    @Test func acknowledgementIsPerUser() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            try await database.insertMetrics(user: 1, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await database.insertMetrics(user: 2, date: "2025-10-29", computedAt: "2025-10-29T15:00:00.000Z")
            try await APIServer.run(database: database) { port in
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 2, version: 1, computedAt: "2025-10-29T14:30:45.123Z"),
                    status: 404, code: .stale)
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: 1, computedAt: "2025-10-29T14:30:45.123Z"),
                    version: 1)
                #expect(try await Self.current(port: port, user: 2).data["acknowledged"] == .bool(false))
            }
        }
    }

    /// Every malformed body: 400 with the error body whose message names the bad field.
    @Test func malformedBodiesAre400NamingTheField() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(user: 1, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database) { port in
                let date = #""metricsComputedAt":"2025-10-29T14:30:45.123Z""#
                let cases: [(String, String)] = [
                    // Not a JSON object at all.
                    ("", "body"), ("{", "body"), (#"{"version":1,"#, "body"), ("[1]", "body"), (#""text""#, "body"),
                    ("1", "body"), ("null", "body"), ("true", "body"), (#"{'version':1}"#, "body"),
                    (#"{"version":1 "metricsComputedAt":"x"}"#, "body"), ("{\"version\":NaN,\(date)}", "body"),
                    // version
                    ("{\(date)}", "version"), ("{\"version\":null,\(date)}", "version"),
                    ("{\"version\":\"1\",\(date)}", "version"), ("{\"version\":1.5,\(date)}", "version"),
                    ("{\"version\":true,\(date)}", "version"), ("{\"version\":[1],\(date)}", "version"),
                    ("{\"version\":{\"v\":1},\(date)}", "version"),
                    ("{\"version\":99999999999999999999999999,\(date)}", "version"),
                    ("{\"version\":2147483648,\(date)}", "version"), ("{\"version\":1e400,\(date)}", "version"),
                    ("{\"version\":-1e400,\(date)}", "version"), ("{\"version\":99,\(date)}", "version"),
                    ("{\"version\":0,\(date)}", "version"), ("{\"version\":-1,\(date)}", "version"),
                    ("{\"version\":\"NaN\",\(date)}", "version"), ("{\"version\":\"Infinity\",\(date)}", "version"),
                    ("{\"version\":\"1; DROP TABLE users\",\(date)}", "version"),
                    // metricsComputedAt
                    (#"{"version":1}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":null}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":1761748245123}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":true}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":["2025-10-29T14:30:45.123Z"]}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":{}}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"yesterday"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":""}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-13-01T00:00:00Z"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-02-30T00:00:00Z"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29T24:00:00Z"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:60Z"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.1234Z"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123+0000"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z "}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"NaN"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"Infinity"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z\u0000"}"#, "metricsComputedAt"),
                    (#"{"version":1,"metricsComputedAt":"' OR '1'='1"}"#, "metricsComputedAt"),
                    (
                        #"{"version":1,"metricsComputedAt":"2025-10-29T14:30:45.123Z'; DROP TABLE users; --"}"#,
                        "metricsComputedAt"
                    ),
                ]
                for (body, field) in cases {
                    let reply = try await API.acknowledge(port: port, user: 1, body: body)
                    let message = expectErrorBody(reply, status: 400, code: .invalidBody)
                    if field == "body" {
                        #expect(
                            message.contains("version") && message.contains("metricsComputedAt"), "\(body): \(message)")
                    } else {
                        #expect(message.contains(field), "\(body): \(message) does not name \(field)")
                    }
                }
                // Nothing was acknowledged, nothing dropped.
                #expect(try await database.value("SELECT count(*) FROM metrics_acknowledgements") == "0")
                #expect(try await database.value("SELECT count(*) FROM users") == "1")
                // Unknown extra fields are ignored: the body names the metrics, and that is enough.
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, body: "{\"version\":1,\(date),\"note\":\"hi\"}"),
                    version: 1)
            }
        }
    }

    /// A version the build does not know is a 400 naming version, even when well-formed; a known older version
    /// that is not current is a 404.
    @Test func unknownVersionIs400KnownOldVersionIs404() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(
                user: 1, version: 2, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database, formula: .rehearsal(version: 2)) { port in
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 1, version: 3, computedAt: "2025-10-29T14:30:45.123Z"),
                    status: 400, code: .invalidBody, contains: ["version"])
                expectErrorBody(
                    try await API.acknowledge(port: port, user: 1, version: 1, computedAt: "2025-10-29T14:30:45.123Z"),
                    status: 404, code: .stale)
                _ = try Self.expectAcknowledged(
                    try await API.acknowledge(port: port, user: 1, version: 2, computedAt: "2025-10-29T14:30:45.123Z"),
                    version: 2)
            }
        }
    }

    static func queue(_ database: TestDatabase, formula: MetricsFormula = .current) -> WorkQueue {
        var configuration = WorkQueue.Configuration()
        configuration.batchSize = 3
        configuration.chunkSize = 4
        return WorkQueue(
            pool: database.pool, formula: formula, owner: "ack-tests", configuration: configuration,
            logger: database.logger)
    }

    /// Waits until the daemon has no unfinished daily unit or recompute job (so no row changes behind a test).
    static func settle(_ database: TestDatabase, _ daemon: DaemonProcess) async throws {
        let settled = try await DaemonProcess.eventually(timeout: .seconds(30)) {
            let busy = try await database.value(
                """
                SELECT (SELECT count(*) FROM daily_units WHERE state IN ('pending', 'running'))
                     + (SELECT count(*) FROM recompute_jobs WHERE state IN ('pending', 'running'))
                """)
            let units = try await database.value("SELECT count(*) FROM daily_units")
            return busy == "0" && units != "0"
        }
        try #require(settled, "the daemon's work did not finish; output:\n\(daemon.log.suffix(2000))")
    }

    /// Runs the daily job for every zone due at `instant`, to the end.
    static func runDaily(_ database: TestDatabase, at instant: String) async throws {
        let now = try #require(Timestamp(iso8601: instant))
        let queue = Self.queue(database)
        _ = try await queue.enqueueDueUnits(dailyAt: .default, now: now)
        while let chunk = try await queue.claim(now: now) { _ = try await queue.process(chunk, now: now) }
        _ = try await queue.finishCompleted(now: now)
    }
}
