import Foundation
import HTTPTypes
import HealthMetrics
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdTestSupport
import Testing

/// HTTP: `GET /v1/profile/metrics/today` over real HTTP against the real database, field for field as
/// the API document writes it, and every kind of 401.
@Suite struct LatestMetricsHTTPTests {
    static let path = "/v1/profile/metrics/today"

    /// Checks the documented body shape (exact key sets at every level, types); returns `data`.
    @discardableResult
    static func expectTodayShape(_ reply: APIReply, sourceLocation: SourceLocation = #_sourceLocation) throws
        -> JSONValue
    {
        #expect(reply.status == 200, "\(reply)", sourceLocation: sourceLocation)
        #expect(reply.headers[.contentType]?.hasPrefix("application/json") == true, sourceLocation: sourceLocation)
        #expect(reply.requestID?.isEmpty == false, sourceLocation: sourceLocation)
        let body = try #require(reply.json, "not JSON: \(reply)", sourceLocation: sourceLocation)
        #expect(body.keys == ["success", "data"], sourceLocation: sourceLocation)
        #expect(body["success"] == .bool(true), sourceLocation: sourceLocation)
        let data = try #require(body["data"], sourceLocation: sourceLocation)
        #expect(
            data.keys == ["metrics", "explanations", "acknowledged", "acknowledgement"], sourceLocation: sourceLocation)
        let metrics = try #require(data["metrics"], sourceLocation: sourceLocation)
        #expect(metrics.keys == ["bmi", "bmr", "tdee", "computedAt", "version"], sourceLocation: sourceLocation)
        #expect(metrics["bmi"]?.number != nil, "bmi is a number: \(reply)", sourceLocation: sourceLocation)
        #expect(metrics["bmr"]?.int != nil, "bmr is an integer: \(reply)", sourceLocation: sourceLocation)
        #expect(metrics["tdee"]?.int != nil, "tdee is an integer: \(reply)", sourceLocation: sourceLocation)
        #expect(metrics["version"]?.int != nil, "version is an integer: \(reply)", sourceLocation: sourceLocation)
        #expect(
            isISOMilliseconds(metrics["computedAt"]?.string), "computedAt: \(reply)", sourceLocation: sourceLocation)
        let explanations = try #require(data["explanations"], sourceLocation: sourceLocation)
        #expect(explanations.keys == ["bmi", "bmr", "tdee"], sourceLocation: sourceLocation)
        for key in ["bmi", "bmr", "tdee"] {
            #expect(explanations[key]?.string?.isEmpty == false, "explanation \(key)", sourceLocation: sourceLocation)
        }
        #expect(data["acknowledged"]?.bool != nil, "acknowledged is a boolean", sourceLocation: sourceLocation)
        if data["acknowledged"] == .bool(false) {
            #expect(data["acknowledgement"] == .null, sourceLocation: sourceLocation)
        } else {
            let acknowledgement = try #require(data["acknowledgement"], sourceLocation: sourceLocation)
            #expect(acknowledgement.keys == ["acknowledgedAt", "version"], sourceLocation: sourceLocation)
            #expect(isISOMilliseconds(acknowledgement["acknowledgedAt"]?.string), sourceLocation: sourceLocation)
            #expect(acknowledgement["version"] == metrics["version"], sourceLocation: sourceLocation)
        }
        expectNoLeak(reply, sourceLocation: sourceLocation)
        return data
    }

    @Test func bodyMatchesTheSpecFieldForField() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(
                user: 1, bmi: "24.5", bmr: 1650, tdee: 2475, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database) { port in
                let reply = try await API.today(port: port, user: 1)
                let data = try Self.expectTodayShape(reply)
                #expect(
                    data["metrics"]
                        == .object([
                            "bmi": .number(24.5), "bmr": .number(1650), "tdee": .number(2475),
                            "computedAt": .string("2025-10-29T14:30:45.123Z"), "version": .number(1),
                        ]))
                #expect(data["acknowledged"] == .bool(false))
                #expect(data["acknowledgement"] == .null)
                // Written exactly: the decimal as stored, `null` spelled out, UTC with milliseconds.
                #expect(
                    reply.text.contains(
                        #""bmi":24.5,"bmr":1650,"tdee":2475,"computedAt":"2025-10-29T14:30:45.123Z","version":1"#))
                #expect(reply.text.contains(#""acknowledged":false,"acknowledgement":null"#))
                #expect(data["explanations"]?["bmi"]?.string?.contains("24.5") == true)
            }
        }
    }

    @Test func computedAtIsTheRowsInstantToTheMillisecond() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2), .valid(3)])
            // Rows written by something else than metricsd may carry microseconds, and any offset.
            try await database.insertMetrics(user: 1, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123456Z")
            try await database.insertMetrics(user: 2, date: "2025-10-29", computedAt: "2025-10-29T20:15:45.000+05:45")
            try await database.insertMetrics(user: 3, date: "2025-10-29", computedAt: "2025-10-29T14:30:45Z")
            try await APIServer.run(database: database) { port in
                let expected: [Int64: String] = [
                    1: "2025-10-29T14:30:45.123Z", 2: "2025-10-29T14:30:45.000Z", 3: "2025-10-29T14:30:45.000Z",
                ]
                for (user, computedAt) in expected {
                    let data = try Self.expectTodayShape(try await API.today(port: port, user: user))
                    #expect(data["metrics"]?["computedAt"]?.string == computedAt, "user \(user)")
                    let stored = try await database.value(
                        "SELECT to_char(computed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') FROM profile_metrics WHERE user_id = $1",
                        [String(user)])
                    #expect(stored == computedAt, "user \(user)")
                }
            }
        }
    }

    @Test func newestRowWinsAcrossDatesAndVersions() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            // By computed_at, not by date or version: the newest row is version 2 for an older date.
            try await database.insertMetrics(
                user: 1, bmi: "20.0", date: "2025-10-27", computedAt: "2025-10-27T00:05:00Z")
            try await database.insertMetrics(
                user: 1, bmi: "21.0", date: "2025-10-28", computedAt: "2025-10-28T00:05:00Z")
            try await database.insertMetrics(
                user: 1, bmi: "22.0", version: 2, date: "2025-10-28", computedAt: "2025-10-28T09:00:00.500Z")
            try await database.insertMetrics(
                user: 1, bmi: "23.0", date: "2025-10-29", computedAt: "2025-10-28T08:59:59.999Z")
            try await database.insertMetrics(
                user: 1, bmi: "24.0", version: 2, date: "2025-10-26", computedAt: "2025-10-26T00:05:00Z")
            // Another user's newer row never leaks in.
            try await database.insertMetrics(
                user: 2, bmi: "30.0", date: "2025-10-30", computedAt: "2025-10-30T00:05:00Z")
            try await APIServer.run(database: database, formula: .rehearsal(version: 2)) { port in
                let data = try Self.expectTodayShape(try await API.today(port: port, user: 1))
                #expect(data["metrics"]?["bmi"] == .number(22.0))
                #expect(data["metrics"]?["version"] == .number(2))
                #expect(data["metrics"]?["computedAt"] == .string("2025-10-28T09:00:00.500Z"))
                // A row recomputed later (same date and version, computed_at moved forward) wins next.
                try await database.execute(
                    "UPDATE profile_metrics SET bmi = 25.0, computed_at = '2025-10-28T09:00:00.501Z' WHERE user_id = 1 AND bmi = 20.0"
                )
                let next = try Self.expectTodayShape(try await API.today(port: port, user: 1))
                #expect(next["metrics"]?["bmi"] == .number(25.0))
                #expect(next["metrics"]?["version"] == .number(1))
                #expect(next["metrics"]?["computedAt"] == .string("2025-10-28T09:00:00.501Z"))
            }
        }
    }

    @Test func justOnboardedUserGets200OnTheFirstRequestAndTheRowIsStored() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1, timezone: "Asia/Kathmandu")])
            try await APIServer.run(database: database) { port in
                let reply = try await API.today(port: port, user: 1)
                let data = try Self.expectTodayShape(reply)
                // 70 kg, 175 cm, female, moderately active, born 1990-05-17, on the user's local date.
                let localText = try await database.value("SELECT (now() AT TIME ZONE 'Asia/Kathmandu')::date::text")
                let localDate = try #require(localText.flatMap { LocalDate(iso: $0) })
                let age = localDate.years(since: LocalDate(iso: "1990-05-17")!)
                let bmr40 = 4 * 7000 + 25 * 1750 - 200 * age - 40 * 161  // BMR in 1/40 kcal
                #expect(data["metrics"]?["bmi"] == .number(22.9))
                #expect(data["metrics"]?["bmr"]?.int == Int64((Double(bmr40) / 40).rounded()))
                #expect(data["metrics"]?["tdee"]?.int == Int64((Double(bmr40) * 1.55 / 40).rounded()))
                #expect(data["metrics"]?["version"] == .number(1))
                #expect(data["acknowledged"] == .bool(false))
                let rows = try await database.rows(
                    """
                    SELECT metrics_date::text, version::text,
                           to_char(computed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                    FROM profile_metrics WHERE user_id = 1
                    """)
                #expect(rows.count == 1)
                #expect(rows.first?[0] == localDate.description)
                #expect(rows.first?[1] == "1")
                #expect(rows.first?[2] == data["metrics"]?["computedAt"]?.string)
                // The second request reads the stored row: same instant, nothing written again.
                let again = try Self.expectTodayShape(try await API.today(port: port, user: 1))
                #expect(again["metrics"] == data["metrics"])
                #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "1")
            }
        }
    }

    @Test func concurrentFirstRequestsOfAJustOnboardedUserAllGet200() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await APIServer.run(database: database) { port in
                let replies = try await withThrowingTaskGroup(of: APIReply.self) { group in
                    for _ in 0..<8 { group.addTask { try await API.today(port: port, user: 1) } }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(replies.allSatisfy { $0.status == 200 }, "\(replies)")
                #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "1")
            }
        }
    }

    @Test(arguments: [
        (SeedUser(id: 1, height: "72.0"), ["height 72 cm is outside 100–250 cm"]),
        (SeedUser(id: 1, weight: "301.00"), ["weight 301 kg is outside 30–300 kg"]),
        (
            SeedUser(id: 1, dateOfBirth: nil, gender: "robot"),
            ["date of birth is missing", "gender 'robot' is not one of"]
        ),
        (SeedUser(id: 1, activity: "couch"), ["activity level 'couch' is not one of"]),
        (SeedUser(id: 1, onboardingCompleted: false), ["onboarding is not completed"]),
        (SeedUser(id: 1, hasSettings: false), ["no settings"]),
        (SeedUser(id: 1, timezone: "Mars/Olympus_Mons"), ["timezone 'Mars/Olympus_Mons' is not a time zone"]),
    ])
    func badSettingsGive404SayingWhy(user: SeedUser, reasons: [String]) async throws {
        try await withTestDatabase { database in
            try await database.seed([user])
            try await APIServer.run(database: database) { port in
                let reply = try await API.today(port: port, user: 1)
                expectErrorBody(reply, status: 404, code: .settingsInvalid, contains: reasons)
                #expect(try await database.value("SELECT count(*) FROM profile_metrics") == "0")
            }
        }
    }

    @Test func unknownUserGets404() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            _ = try await APIServer.run(database: database) { port in
                expectErrorBody(try await API.today(port: port, user: 999), status: 404, code: .userUnknown)
            }
        }
    }

    /// Every bad-token kind: the documented error body with 401, and `WWW-Authenticate: Bearer`.
    @Test func everyBadTokenKindIs401() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await database.insertMetrics(user: 1, date: "2025-10-29", computedAt: "2025-10-29T14:30:45.123Z")
            try await APIServer.run(database: database) { port in
                let valid = TestTokens.user(1)
                let parts = valid.split(separator: ".").map(String.init)
                var signature = Array(parts[2])
                signature[10] = signature[10] == "A" ? "B" : "A"
                let cases: [(String, HTTPFields, [AppError.Code])] = [
                    ("missing header", [:], [.tokenMissing]),
                    // An empty field may be sent as is or left out by the client.
                    ("empty header", [.authorization: ""], [.authorizationMalformed, .tokenMissing]),
                    ("not Bearer", [.authorization: "Basic dXNlcjpwYXNz"], [.authorizationMalformed]),
                    ("Bearer without token", [.authorization: "Bearer"], [.authorizationMalformed]),
                    ("Bearer and spaces", [.authorization: "Bearer    "], [.authorizationMalformed]),
                    ("token without scheme", [.authorization: valid], [.authorizationMalformed]),
                    ("garbage token", TestTokens.bearer("not-a-jwt"), [.token(.malformed)]),
                    ("two parts", TestTokens.bearer(parts[0] + "." + parts[1]), [.token(.malformed)]),
                    ("four parts", TestTokens.bearer(valid + ".x"), [.token(.malformed)]),
                    ("not base64url", TestTokens.bearer(parts[0] + ".@@@." + parts[2]), [.token(.malformed)]),
                    (
                        "header not JSON", TestTokens.bearer("bm90IGpzb24." + parts[1] + "." + parts[2]),
                        [.token(.malformedHeader)]
                    ),
                    (
                        "wrong signature", TestTokens.bearer(parts[0] + "." + parts[1] + "." + String(signature)),
                        [.token(.badSignature)]
                    ),
                    ("no signature", TestTokens.bearer(parts[0] + "." + parts[1] + "."), [.token(.badSignature)]),
                    (
                        "payload swapped",
                        TestTokens.bearer(
                            parts[0] + "." + TestTokens.user(2).split(separator: ".")[1] + "." + parts[2]),
                        [.token(.badSignature)]
                    ),
                    ("expired", TestTokens.bearer(TestTokens.user(1, expiresIn: -3600)), [.token(.expired)]),
                    (
                        "other secret",
                        TestTokens.bearer(TestTokens.user(1, secret: "another-secret-of-at-least-32-bytes-0123456789")),
                        [.token(.badSignature)]
                    ),
                    (
                        "no exp",
                        TestTokens.bearer(
                            TestTokens.sign(
                                header: ["alg": "HS256", "typ": "JWT"], claims: ["sub": "1"],
                                secret: APIServer.jwtSecret)),
                        [.token(.noExpiry)]
                    ),
                    ("admin token", TestTokens.bearer(APIServer.adminToken), [.token(.malformed)]),
                ]
                for (name, headers, codes) in cases {
                    let reply = try await API.send(port: port, Self.path, headers: headers)
                    let message = expectErrorBody(reply, status: 401, codes: codes)
                    #expect(reply.headers[.wwwAuthenticate] == "Bearer", "\(name): \(reply)")
                    #expect(!message.contains(valid), "\(name): the token is echoed")
                }
                // The valid token itself passes.
                #expect(try await API.send(port: port, Self.path, headers: TestTokens.bearer(valid)).status == 200)
                #expect(
                    try await API.send(port: port, Self.path, headers: [.authorization: "bearer \(valid)"]).status
                        == 200)
            }
        }
    }
}
