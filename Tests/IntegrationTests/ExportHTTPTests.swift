import Foundation
import HTTPTypes
import HealthMetrics
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdTestSupport
import Testing

/// `GET /v1/profile/metrics/export` over real HTTP against the real database: every row of every version, the
/// settings as they are now and the acknowledgement, as JSON, CSV (RFC 4180) and a FHIR R4 Bundle that the
/// `fhir.resources` models validate; streamed, and one export per user at a time.
@Suite struct ExportHTTPTests {
    static let path = "/v1/profile/metrics/export"

    static func get(port: Int, user: Int64, accept: String? = nil) async throws -> APIReply {
        var headers = TestTokens.bearer(TestTokens.user(user))
        if let accept { headers[.accept] = accept }
        return try await API.send(port: port, Self.path, headers: headers)
    }

    /// User 1: 731 days of version 1 and 3 of version 2 (the newest acknowledged); user 2: settings invalid since
    /// (a skip record) with 10 days; user 3: no settings row, 2 days; user 4: nothing.
    static func seed(_ database: TestDatabase) async throws {
        try await database.seed([
            .valid(1), SeedUser(id: 2, height: "72.0"), SeedUser(id: 3, hasSettings: false), .valid(4),
        ])
        try await HistoryHTTPTests.seedHistory(database, user: 1, days: 731)
        try await HistoryHTTPTests.seedHistory(database, user: 1, days: 3, version: 2)
        try await HistoryHTTPTests.seedHistory(database, user: 2, days: 10)
        try await HistoryHTTPTests.seedHistory(database, user: 3, days: 2)
        try await database.execute(
            """
            INSERT INTO metrics_skips (user_id, reason_codes, reasons, metrics_date, version, source, recorded_at)
            VALUES (2, '{out_of_range}', 'height 72 cm is outside 100–250 cm', current_date, 1, 'settings', now());
            INSERT INTO metrics_acknowledgements (user_id, version, metrics_computed_at, acknowledged_at)
            SELECT 1, 2, computed_at, now() FROM profile_metrics WHERE user_id = 1 AND version = 2
            ORDER BY metrics_date DESC LIMIT 1;
            UPDATE user_settings SET updated_at = ((now() AT TIME ZONE 'UTC')::date - 1)::timestamp AT TIME ZONE 'UTC'
            WHERE user_id = 1
            """)
    }

    @Test func jsonAndCSVHoldEveryRowOfEveryVersion() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            try await APIServer.run(database: database, formula: .rehearsal(version: 2)) { port in
                let reply = try await Self.get(port: port, user: 1)
                #expect(reply.status == 200, "\(reply)")
                #expect(reply.headers[.contentType] == "application/json")
                #expect(reply.headers[.contentLength] == nil, "streamed: no length known up front")
                #expect(reply.headers[.cacheControl] == "no-store")
                let data = try #require(reply.json?["data"])
                #expect(
                    data.keys == ["userId", "timezone", "settings", "settingsProblems", "acknowledgement", "metrics"])
                #expect(data["settings"]?["heightCm"]?.number == 175 && data["settings"]?["weightKg"]?.number == 70)
                #expect(data["settingsProblems"] == .null)
                #expect(data["acknowledgement"]?["version"]?.int == 2)
                guard case .array(let rows) = data["metrics"] else {
                    Issue.record("\(reply)")
                    return
                }
                #expect(rows.count == 734)
                let keys = rows.map { "\($0["version"]?.int ?? 0) \($0["date"]?.string ?? "")" }
                #expect(keys == keys.sorted(), "by version, then date")
                #expect(rows.filter { $0["acknowledgedAt"] != .null }.count == 1)

                let invalid = try await Self.get(port: port, user: 2)
                #expect(invalid.status == 200, "an export is a copy of what is held, whatever the settings")
                #expect(invalid.json?["data"]?["settingsProblems"]?.string == "height 72 cm is outside 100–250 cm")
                #expect(try await Self.get(port: port, user: 3).json?["data"]?["settings"] == .null)
                _ = expectErrorBody(try await Self.get(port: port, user: 99), status: 404, code: .userUnknown)

                let csv = try await Self.get(port: port, user: 1, accept: "text/csv")
                #expect(csv.status == 200 && csv.headers[.contentType]?.hasPrefix("text/csv") == true, "\(csv)")
                #expect(
                    csv.text.hasSuffix("\r\n") && !csv.text.replacingOccurrences(of: "\r\n", with: "").contains("\n"))
                let lines = csv.text.components(separatedBy: "\r\n").dropLast()
                #expect(lines.first == "date,version,bmi,bmr,tdee,computed_at,acknowledged_at")
                #expect(lines.count == 735)
                #expect(
                    lines.dropFirst().allSatisfy {
                        $0.split(separator: ",", omittingEmptySubsequences: false).count == 7
                    })
                #expect(lines.contains { $0.hasPrefix("\(HistoryHTTPTests.daysAgo(89)),1,28.9,1589,2289,") })

                for accept in ["application/xml", "text/html, image/png"] {
                    _ = expectErrorBody(
                        try await Self.get(port: port, user: 1, accept: accept), status: 406, code: .notAcceptable)
                }
                #expect(try await Self.get(port: port, user: 1, accept: "text/html, */*;q=0.1").status == 200)
            }
        }
    }

    /// The FHIR Bundle of every test user, validated by the `fhir.resources` (R4B) models with no error, and
    /// its codes, units and references checked.
    @Test func fhirBundlesValidate() async throws {
        try await withTestDatabase { database in
            try await Self.seed(database)
            try await APIServer.run(database: database, formula: .rehearsal(version: 2)) { port in
                var files: [String] = []
                for user: Int64 in [1, 2, 3, 4] {
                    let reply = try await Self.get(port: port, user: user, accept: "application/fhir+json")
                    #expect(reply.status == 200 && reply.headers[.contentType] == "application/fhir+json", "\(reply)")
                    let file = FileManager.default.temporaryDirectory.appending(
                        path: "metricsd-fhir-\(getpid())-\(user).json"
                    ).path
                    try reply.text.write(toFile: file, atomically: true, encoding: .utf8)
                    files.append(file)
                    let entries = try Self.entries(reply)
                    let observations = entries.filter { $0["resourceType"]?.string == "Observation" }
                    let rows = [1: 734, 2: 10, 3: 2, 4: 0][Int(user)]!
                    let codes = observations.compactMap { observation -> String? in
                        guard case .array(let coding) = observation["code"]?["coding"] else { return nil }
                        return coding.first?["code"]?.string
                    }
                    #expect(
                        codes.filter { $0 == "39156-5" }.count == rows && codes.filter { $0 == "bmr" }.count == rows)
                    #expect(codes.filter { $0 == "tdee" }.count == rows)
                    #expect(codes.contains("29463-7") == (user != 3) && codes.contains("8302-2") == (user != 3))
                    if user == 1 {
                        let derived = observations.filter { $0["derivedFrom"] != nil }.count
                        // The settings changed at the start of yesterday (UTC), before the rows of today and yesterday (both
                        // versions, computed at 00:05 UTC) and after the 730 older ones, whatever the time of day the test runs.
                        #expect(derived == 2 * 2 * 3, "derivedFrom on \(derived) Observations")
                    }
                }
                let validation = try await Subprocess.run("/usr/bin/env", ["python3", "-c", Self.validator] + files)
                print("fhir: \(validation.output.trimmingCharacters(in: .whitespacesAndNewlines))")
                #expect(validation.status == 0, "\(validation.output)")
                #expect(validation.output.contains("errors 0"), "\(validation.output)")
                for file in files { try? FileManager.default.removeItem(atPath: file) }
            }
        }
    }

    static func entries(_ reply: APIReply) throws -> [JSONValue] {
        guard case .array(let entries) = try #require(reply.json)["entry"] else { return [] }
        return entries.compactMap { $0["resource"] }
    }

    /// Validates each file as a FHIR R4B `Bundle` (`fhir.resources`, pydantic models of the specification) and
    /// every resource in it; prints the resources checked and the errors.
    static let validator = """
        import json, sys
        from fhir.resources.R4B.bundle import Bundle
        errors, resources = 0, 0
        for name in sys.argv[1:]:
            try:
                bundle = Bundle.model_validate(json.load(open(name)))
                resources += len(bundle.entry or [])
            except Exception as error:
                errors += 1
                print(name, str(error)[:2000])
        print(f"bundles {len(sys.argv) - 1} resources {resources} errors {errors}")
        sys.exit(1 if errors else 0)
        """

    /// A second export of the same user while the first is still being sent is a 429; when the first client goes
    /// away its slot is given back.
    @Test func oneExportPerUserAtATime() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1)])
            for version in 1...4 {
                try await HistoryHTTPTests.seedHistory(database, user: 1, days: 731, version: version)
            }
            try await APIServer.run(database: database, formula: .rehearsal(version: 4)) { port in
                let socket = try RawHTTP.connectedSocket(port: port, receiveBuffer: 4096).get()
                let token = TestTokens.user(1)
                #expect(
                    RawHTTP.send(
                        socket,
                        "GET \(Self.path) HTTP/1.1\r\nHost: x\r\nAccept: application/fhir+json\r\nAuthorization: Bearer \(token)\r\n\r\n"
                    ))
                // The first export has begun once its head arrives; its client then reads no more.
                _ = fcntl(socket, F_SETFL, fcntl(socket, F_GETFL) | O_NONBLOCK)
                var head = [UInt8](repeating: 0, count: 256)
                let began = await DaemonProcess.eventually(timeout: .seconds(10)) {
                    let count = head.withUnsafeMutableBytes { recv(socket, $0.baseAddress, $0.count, 0) }
                    if count <= 0 { try? await Task.sleep(for: .milliseconds(10)) }
                    return count > 0
                }
                #expect(
                    began && String(decoding: head.prefix(12), as: UTF8.self) == "HTTP/1.1 200",
                    "the first export's head")
                var seen: [String] = []
                let refused = await DaemonProcess.eventually(timeout: .seconds(8)) {
                    do {
                        let status = try await Self.get(port: port, user: 1, accept: "text/csv").status
                        seen.append(String(status))
                        return status == 429
                    } catch {
                        seen.append("\(error)")
                        return false
                    }
                }
                #expect(refused, "a second export while the first is stuck: \(seen.prefix(5))")
                let second = try await Self.get(port: port, user: 1)
                if second.status == 429 {
                    _ = expectErrorBody(second, status: 429, code: .exportInProgress)
                    #expect(second.headers[.retryAfter] != nil)
                }
                close(socket)
                let freed = await DaemonProcess.eventually(timeout: .seconds(20)) {
                    (try? await Self.get(port: port, user: 1, accept: "text/csv"))?.status == 200
                }
                #expect(freed, "the slot is given back once the stuck client is gone")
            }
        }
    }

    /// A client that asks for a two-year export of many versions and then reads nothing (a raw socket with a small
    /// receive window): the daemon holds no more of the body than its socket takes (its RSS grows by far less
    /// than the body), holds no pooled database connection while the client stalls (a page is read with its own
    /// connection, given back before the page is written), serves other clients' reads meanwhile, and closes the
    /// stalled connection once it has taken nothing for the write timeout, with a log line; the user's export slot
    /// is then free again.
    @Test func aClientThatStopsReadingIsCutOffAndHoldsNothing() async throws {
        try await withTestDatabase { database in
            try await database.seed([.valid(1), .valid(2)])
            for version in 1...12 {
                try await HistoryHTTPTests.seedHistory(database, user: 1, days: 731, version: version)
            }
            try await HistoryHTTPTests.seedHistory(database, user: 2, days: 100)
            let port = DaemonProcess.freePort()
            let writeTimeout = 6
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: ["METRICSD_HTTP_WRITE_TIMEOUT_SECONDS": "\(writeTimeout)"]),
                port: port)
            try await daemon.waitUntilReady()
            #expect(
                try await Self.get(port: port, user: 2, accept: "application/fhir+json").status == 200,
                "a warm-up export")
            let before = ProcessProbe.residentKiB(daemon.pid)

            let client = try HostileSocket(port: port, receiveBuffer: 4096)
            let asked = ContinuousClock.now
            #expect(
                await client.send(
                    "GET \(Self.path) HTTP/1.1\r\nHost: x\r\nAccept: application/fhir+json\r\nAuthorization: Bearer \(TestTokens.user(1))\r\n\r\n"
                ))
            try await Task.sleep(for: .seconds(1))
            #expect(
                try await Self.get(port: port, user: 1, accept: "text/csv").status == 429,
                "the export still streams: stalled, not sent")

            // Other clients are served meanwhile, each well within a second.
            for _ in 0..<5 {
                let started = ContinuousClock.now
                #expect(try await API.today(port: port, user: 2).status == 200)
                #expect(try await HistoryHTTPTests.get(port: port, user: 2).status == 200)
                #expect(ContinuousClock.now - started < .seconds(1), "two reads beside the stalled export")
            }
            // No pooled connection is held for it (the scheduler's ticks use one now and then: wait for a moment
            // without), and it is still stalled then.
            var inUse: [Double] = []
            let idle = await DaemonProcess.eventually(timeout: .seconds(3)) {
                let value = PrometheusScrape.value(
                    (try? await PrometheusScrape.scrape(daemon)) ?? [:], "metricsd_db_pool_connections",
                    ["state": "in_use"])
                inUse.append(value ?? -1)
                return value == 0
            }
            #expect(idle, "pooled connections in use while the export stalls: \(inUse)")
            #expect(try await Self.get(port: port, user: 1, accept: "text/csv").status == 429, "still stalled")
            let grownKiB = ProcessProbe.residentKiB(daemon.pid) - before

            // Cut off by the write deadline: the daemon logs it and closes its side (what it had queued arrives,
            // then the end, without the body's last chunk), and frees the user's slot.
            let cut = await DaemonProcess.eventually(timeout: .seconds(writeTimeout + 6)) {
                daemon.log.contains("Export cut off")
            }
            let after = ContinuousClock.now - asked
            #expect(
                cut && after < .seconds(writeTimeout + 6),
                "cut off \(after) after the request, write timeout \(writeTimeout) s:\n\(daemon.log.suffix(2000))")
            let (bytes, closedAfter) = await client.readUntilClosed(timeout: .seconds(10))
            #expect(closedAfter != nil, "the daemon closed the stalled connection")
            #expect(!bytes.isEmpty && !bytes.suffix(5).elementsEqual("0\r\n\r\n".utf8), "a cut body, never a whole one")
            let whole = try await Self.get(port: port, user: 1, accept: "application/fhir+json")
            #expect(whole.status == 200, "the slot is free again")
            let bodyKiB = whole.text.utf8.count / 1024
            #expect(
                bodyKiB > 8 * 1024,
                "the body (\(bodyKiB) KiB) is twice what the sockets can hold (at most 4 MiB sent unread)")
            #expect(
                grownKiB < min(16 * 1024, bodyKiB / 4),
                "RSS grew by \(grownKiB) KiB while a \(bodyKiB) KiB export stalled")
        }
    }
}
