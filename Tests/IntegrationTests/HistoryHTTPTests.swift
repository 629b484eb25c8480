import Foundation
import HTTPTypes
import HealthMetrics
import HummingbirdTesting
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdTestSupport
import Testing

/// `GET /v1/profile/metrics/history` over real HTTP against the real database, and the rule every read shares:
/// metrics computed from settings that are no longer valid are never served as the person's metrics.
@Suite struct HistoryHTTPTests {
    static let path = "/v1/profile/metrics/history"

    static func get(port: Int, user: Int64, _ query: String = "", headers: HTTPFields = [:]) async throws -> APIReply {
        try await API.send(
            port: port, Self.path + query, headers: TestTokens.bearer(TestTokens.user(user)).merging(headers))
    }

    /// Today's UTC date, `days` earlier.
    static func daysAgo(_ days: Int) -> LocalDate {
        let today = LocalDate(daysSinceEpoch: Int(Date().timeIntervalSince1970 / 86_400))!
        return today.adding(days: -days)!
    }

    /// Rows for user `user`, version `version`, one per date from `days - 1` days ago through today (UTC), BMI
    /// 20.0 + 0.1 × age in days so each date's row is recognisable.
    static func seedHistory(_ database: TestDatabase, user: Int64, days: Int, version: Int = 1) async throws {
        _ = try await database.rows(
            """
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
            SELECT $1, 20.0 + g / 10.0, 1500 + g, 2200 + g, $2, (now() AT TIME ZONE 'UTC')::date - g,
                   ((now() AT TIME ZONE 'UTC')::date - g)::timestamp AT TIME ZONE 'UTC' + interval '5 minutes'
            FROM generate_series(0, $3 - 1) g
            """, [String(user), String(version), String(days)])
    }

    /// Default range (the last 90 days), field for field, oldest first; paging by cursor reaches every entry once.
    @Test func defaultRangeIsTheLastNinetyDaysPagedByCursor() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            try await Self.seedHistory(database, user: 1, days: 120)
            try await Self.seedHistory(database, user: 2, days: 5)
            try await APIServer.run(database: database) { port in
                let first = try await Self.get(port: port, user: 1)
                #expect(first.status == 200, "\(first)")
                #expect(first.headers[.cacheControl] == "private, no-cache")
                let data = try #require(first.json?["data"])
                #expect(data.keys == ["from", "to", "version", "entries", "nextCursor"])
                #expect(data["from"]?.string == Self.daysAgo(89).description)
                #expect(data["to"]?.string == Self.daysAgo(0).description)
                #expect(data["version"]?.int == 1)
                guard case .array(let entries) = data["entries"] else {
                    Issue.record("entries: \(first)")
                    return
                }
                #expect(entries.count == 90)
                let entry = try #require(entries.first)
                #expect(entry.keys == ["date", "bmi", "bmr", "tdee", "computedAt", "acknowledged", "acknowledgedAt"])
                #expect(entry["date"]?.string == Self.daysAgo(89).description)
                #expect(entry["bmi"]?.number == 28.9)
                #expect(entry["bmr"]?.int == 1589)
                #expect(entry["acknowledged"] == .bool(false) && entry["acknowledgedAt"] == .null)
                #expect(isISOMilliseconds(entry["computedAt"]?.string))
                #expect(
                    first.text.contains("\"nextCursor\":null"),
                    "90 entries fit in one page of \(HistoryQuery.defaultLimit)")

                // Pages of 30: three pages, every date once, in order.
                var dates: [String] = []
                var cursor: String?
                var pages = 0
                repeat {
                    let reply = try await Self.get(
                        port: port, user: 1, "?limit=30" + (cursor.map { "&cursor=\($0)" } ?? ""))
                    #expect(reply.status == 200, "\(reply)")
                    guard case .array(let page) = reply.json?["data"]?["entries"] else { break }
                    dates += page.compactMap { $0["date"]?.string }
                    cursor = reply.json?["data"]?["nextCursor"]?.string
                    pages += 1
                } while cursor != nil && pages < 10
                #expect(pages == 3)
                #expect(dates == (0..<90).reversed().map { Self.daysAgo($0).description })
                // Another user's token sees only their own rows.
                guard case .array(let other) = try await Self.get(port: port, user: 2).json?["data"]?["entries"] else {
                    Issue.record("user 2 has no entries array")
                    return
                }
                #expect(other.count == 5)
            }
        }
    }

    /// An explicit range up to the maximum span, past versions on request, the acknowledged entry marked, and a
    /// 304 for a matching `If-None-Match`.
    @Test func rangesVersionsAcknowledgementAndRevalidation() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await Self.seedHistory(database, user: 1, days: 731)
            try await Self.seedHistory(database, user: 1, days: 3, version: 2)
            let formula = MetricsFormula.rehearsal(version: 2)
            try await APIServer.run(database: database, formula: formula) { port in
                let from = Self.daysAgo(730)
                let to = Self.daysAgo(0)
                let all = try await Self.get(port: port, user: 1, "?from=\(from)&to=\(to)&version=1&limit=731")
                guard case .array(let entries) = all.json?["data"]?["entries"] else {
                    Issue.record("\(all)")
                    return
                }
                #expect(entries.count == 731)
                #expect(
                    entries.first?["date"]?.string == from.description
                        && entries.last?["date"]?.string == to.description)

                let current = try await Self.get(port: port, user: 1)
                #expect(current.json?["data"]?["version"]?.int == 2, "the build's version by default")
                guard case .array(let v2) = current.json?["data"]?["entries"] else {
                    Issue.record("\(current)")
                    return
                }
                #expect(v2.count == 3)

                let newest = try #require(v2.last?["computedAt"]?.string)
                let ack = try await API.acknowledge(port: port, user: 1, version: 2, computedAt: newest)
                #expect(ack.status == 200, "\(ack)")
                let after = try await Self.get(port: port, user: 1)
                guard case .array(let acknowledged) = after.json?["data"]?["entries"] else {
                    Issue.record("\(after)")
                    return
                }
                #expect(acknowledged.map { $0["acknowledged"] } == [.bool(false), .bool(false), .bool(true)])
                #expect(
                    acknowledged.last?["acknowledgedAt"]?.string
                        == ack.json?["data"]?["acknowledgement"]?["acknowledgedAt"]?.string)
                #expect(after.headers[.eTag] != current.headers[.eTag], "the acknowledgement changes the tag")

                let tag = try #require(after.headers[.eTag])
                let revalidated = try await Self.get(port: port, user: 1, headers: [.ifNoneMatch: tag])
                #expect(revalidated.status == 304 && revalidated.text.isEmpty)
                #expect(revalidated.headers[.eTag] == tag)
            }
        }
    }

    /// Every bad parameter is a 400 whose message names it; nothing is read for it.
    @Test func badParametersAreRefusedByName() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            try await Self.seedHistory(database, user: 1, days: 3)
            try await APIServer.run(database: database) { port in
                let cases: [(String, String)] = [
                    ("?from=2025-02-30", "from"), ("?to=yesterday", "to"), ("?from=2025-1-01", "from"),
                    ("?version=0", "version"), ("?version=999", "version"), ("?version=1.0", "version"),
                    ("?limit=0", "limit"), ("?limit=732", "limit"), ("?limit=-1", "limit"),
                    ("?cursor=abc", "cursor"), ("?cursor=c20251399", "cursor"),
                    ("?from=2020-01-01&to=2022-01-02", "from"), ("?from=2025-03-02&to=2025-03-01", "from"),
                    ("?from=2025-01-01&from=2025-01-02", "from"), ("?to=%ZZ", "to"),
                    ("?from=2025-01-01&to=2025-01-31&cursor=c20250301", "cursor"),
                ]
                for (query, name) in cases {
                    let reply = try await Self.get(port: port, user: 1, query)
                    _ = expectErrorBody(reply, status: 400, code: .invalidParameter)
                    #expect(reply.json?["error"]?.string?.hasPrefix(name) == true, "\(query): \(reply)")
                    #expect(reply.headers[.cacheControl] == "no-store")
                }
                let unknown = try await Self.get(port: port, user: 99)
                _ = expectErrorBody(unknown, status: 404, code: .userUnknown)
            }
        }
    }

    /// The read that never misleads: a user whose settings become invalid after their metrics were computed gets
    /// the 404 with the reasons from the latest read, the history and the acknowledgement's read — from the real
    /// daemon, which records the verdict when it sees the change — and their metrics again once the settings are
    /// fixed.
    @Test func invalidSettingsAreNeverServedAsCurrentMetrics() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            try await database.execute(
                """
                INSERT INTO daily_units (timezone, local_date, version, timezone_known, state, users_total, created_at)
                SELECT DISTINCT timezone, date '2999-12-31', 1, true, 'done', 0, now() FROM users
                """)
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port, extra: ["METRICSD_WORKERS": "1"]),
                port: port)
            try await daemon.waitUntilReady()
            let user = TestTokens.bearer(TestTokens.user(1))
            let before = try await daemon.request("/v1/profile/metrics/today", headers: user)
            #expect(before.status == .ok, "\(before.text)")

            try await database.execute("UPDATE user_settings SET height = 72.0 WHERE user_id = 1")
            let refused = await DaemonProcess.eventually(timeout: .seconds(10)) {
                (try? await daemon.request("/v1/profile/metrics/today", headers: user))?.status == .notFound
            }
            #expect(refused, "the latest read still served metrics computed from the old height")
            for path in ["/v1/profile/metrics/today", Self.path] {
                let reply = try await daemon.request(path, headers: user)
                #expect(reply.status == .notFound, "\(path): \(reply.text)")
                let body = try reply.json()
                #expect(body["code"] as? String == "metrics.settings_invalid", "\(path): \(reply.text)")
                #expect(body["error"] as? String == "no metrics: height 72 cm is outside 100–250 cm", "\(path)")
            }
            let shown = try before.json()["data"] as? [String: Any]
            let computedAt = try #require((shown?["metrics"] as? [String: Any])?["computedAt"] as? String)
            let acknowledged = try await daemon.request(
                "/v1/profile/metrics/acknowledge", method: .post,
                headers: user.merging([.contentType: "application/json"]),
                body: #"{"version":1,"metricsComputedAt":"\#(computedAt)"}"#)
            #expect(acknowledged.status == .notFound, "acknowledging metrics of invalid settings: \(acknowledged.text)")
            #expect(try acknowledged.json()["code"] as? String == "metrics.settings_invalid")
            #expect(
                try await database.value("SELECT count(*) FROM profile_metrics WHERE user_id = 1") == "1",
                "the row is kept")
            let other = try await daemon.request(
                "/v1/profile/metrics/today", headers: TestTokens.bearer(TestTokens.user(2)))
            #expect(other.status == .ok, "another user is unaffected: \(other.text)")

            try await database.execute("UPDATE user_settings SET height = 175.0 WHERE user_id = 1")
            let served = await DaemonProcess.eventually(timeout: .seconds(10)) {
                (try? await daemon.request("/v1/profile/metrics/today", headers: user))?.status == .ok
            }
            #expect(served, "fixed settings serve metrics again")
            let history = try await daemon.request(Self.path, headers: user)
            #expect(history.status == .ok, "\(history.text)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
