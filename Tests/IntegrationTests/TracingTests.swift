import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdTestSupport
import Testing

/// Tracing through the real binary into a real OTLP receiver (``OTLPReceiver``: opentelemetry-proto parses every
/// export) and a real PostgreSQL.
@Suite struct TracingTests {
    /// A user id no span may show (parameter values never enter a span).
    static let userID: Int64 = 4_711_042

    /// A receiver and a traced daemon, ready: tracing to the receiver with `sampler`, every zone's daily time past,
    /// 127.0.0.1 a trusted proxy unless `trustProxy` is false.
    static func start(
        _ database: TestDatabase, sampler: String, trustProxy: Bool = true, more: [String: String] = [:]
    ) async throws -> (receiver: OTLPReceiver, daemon: DaemonProcess) {
        let receiver = try OTLPReceiver()
        try await receiver.waitUntilReady()
        var extra = [
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_TRACES_SAMPLER": sampler,
            "OTEL_SERVICE_NAME": "metricsd-test", "METRICSD_DAILY_AT": "00:00", "METRICSD_WORKERS": "1",
        ]
        if trustProxy { extra["METRICSD_TRUSTED_PROXIES"] = "127.0.0.1" }
        extra.merge(more) { $1 }
        let port = DaemonProcess.freePort()
        let daemon = try DaemonProcess(
            environment: DaemonProcess.environment(databaseURL: database.url, port: port, extra: extra), port: port)
        try await daemon.waitUntilReady()
        return (receiver, daemon)
    }

    static func randomHex(bytes: Int) -> String {
        (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
    }

    static let latestPath = "/v1/profile/metrics/today"
    static let historyPath = "/v1/profile/metrics/history"

    /// A read (the latest unless `path` says otherwise) as a trusted proxy sends it, continuing the proxy's trace.
    static func read(
        _ daemon: DaemonProcess, traceID: String, parentID: String, flags: String = "01",
        path: String = Self.latestPath,
        userID: Int64 = Self.userID
    ) async throws -> TestClient.Response {
        var headers = TestTokens.bearer(TestTokens.user(userID))
        headers[HTTPField.Name("traceparent")!] = "00-\(traceID)-\(parentID)-\(flags)"
        headers[HTTPField.Name("tracestate")!] = "proxy=1"
        return try await daemon.request(path, headers: headers)
    }

    /// The daily unit's chunk span and its statements; then a read: its server span continues the proxy's trace
    /// and answers with its own `traceparent`; the wait for the read batch and the batch's statement are its
    /// children; names and attributes follow OpenTelemetry's HTTP and PostgreSQL conventions; no span carries the
    /// user id the statement was given.
    @Test func readAndDailyUnitAreTraced() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(Self.userID, timezone: "Asia/Kathmandu")])
            let (receiver, daemon) = try await Self.start(database, sampler: "parentbased_always_on")

            // The daily unit (its time, 00:00, has passed in every zone): one chunk span, a root, with statements.
            let daily = await receiver.spans { spans in
                spans.contains { $0.name == "daily unit chunk" }
            }
            let chunk = try #require(daily.first { $0.name == "daily unit chunk" }, "spans: \(daily.map(\.name))")
            #expect(chunk.parentSpanID.isEmpty && chunk.kind == 1)
            #expect(chunk.attributes["metricsd.zone"] == "Asia/Kathmandu")
            #expect(chunk.serviceName == "metricsd-test")
            let chunkStatements = await receiver.spans { spans in
                spans.filter { $0.parentSpanID == chunk.spanID && $0.kind == 3 }.count >= 2
            }.filter { $0.parentSpanID == chunk.spanID && $0.kind == 3 }
            #expect(chunkStatements.count >= 2, "the chunk's statements: \(chunkStatements.map(\.name))")
            for statement in chunkStatements {
                #expect(statement.traceID == chunk.traceID)
                #expect(statement.attributes["db.system.name"] == "postgresql")
                #expect(statement.attributes["db.namespace"] == database.name)
                #expect(statement.attributes["db.query.summary"] == statement.name)
                #expect(statement.startNanos >= chunk.startNanos && statement.endNanos <= chunk.endNanos)
            }

            // The read, continuing the proxy's trace.
            let traceID = Self.randomHex(bytes: 16)
            let parentID = Self.randomHex(bytes: 8)
            let response = try await Self.read(daemon, traceID: traceID, parentID: parentID)
            #expect(response.status == .ok, "\(response.text)")
            let answered = try #require(response.headers[HTTPField.Name("traceparent")!])
            let parts = answered.split(separator: "-").map(String.init)
            try #require(parts.count == 4)
            #expect(parts[0] == "00" && parts[1] == traceID && parts[3] == "01")

            let trace = await receiver.spans { spans in spans.filter { $0.traceID == traceID }.count >= 3 }
                .filter { $0.traceID == traceID }
            let server = try #require(trace.first { $0.kind == 2 }, "the read's spans: \(trace.map(\.name))")
            #expect(server.name == "GET /v1/profile/metrics/today")
            #expect(server.spanID == parts[2], "the answered traceparent names the server span")
            #expect(server.parentSpanID == parentID)
            #expect(server.attributes["http.request.method"] == "GET")
            #expect(server.attributes["http.route"] == "/v1/profile/metrics/today")
            #expect(server.attributes["http.response.status_code"] == "200")
            #expect(server.attributes["url.scheme"] == "http")
            #expect(server.attributes["server.address"] == "127.0.0.1")
            #expect(server.attributes["server.port"] == String(daemon.port))
            let wait = try #require(trace.first { $0.name == "wait for read batch" })
            #expect(wait.parentSpanID == server.spanID && wait.kind == 1)
            let statement = try #require(trace.first { $0.kind == 3 })
            #expect(statement.parentSpanID == server.spanID)
            #expect(statement.name == "latest_metrics")
            #expect(statement.attributes["db.system.name"] == "postgresql")
            #expect(statement.attributes["db.query.summary"] == "latest_metrics")
            #expect(statement.attributes["db.namespace"] == database.name)
            #expect(wait.endNanos <= statement.startNanos, "the wait ends when the batch's statement starts")
            #expect(statement.startNanos >= server.startNanos && statement.endNanos <= server.endNanos)

            for span in receiver.spans {
                for (key, value) in span.attributes {
                    #expect(
                        !value.contains(String(Self.userID)), "\(span.name) \(key)=\(value) shows a parameter value")
                }
            }
            #expect(receiver.rejected.isEmpty, "rejected exports: \(receiver.rejected)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// A sampled read of one request blocked in PostgreSQL (the history read; the test holds a lock on the table it
    /// reads) shows its trace in `pg_stat_activity.query`: the statement's text starts with the sqlcommenter
    /// comment naming the trace.
    @Test func sampledStatementNamesItsTraceInPgStatActivity() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(Self.userID)])
            let (receiver, daemon) = try await Self.start(database, sampler: "parentbased_always_on")
            let traceID = Self.randomHex(bytes: 16)
            let query = try await Self.blockedReadQuery(
                database, daemon: daemon, traceID: traceID, flags: "01", path: Self.historyPath,
                table: "profile_metrics",
                marker: "metrics_acknowledgements")
            #expect(query.hasPrefix("/*traceparent='00-\(traceID)-"), "pg_stat_activity.query: \(query)")
            #expect(query.contains("-01'*/ "))
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            withExtendedLifetime(receiver) {}  // the daemon exports to it until it exits
        }
    }

    /// Sampling off: nothing is exported, no `traceparent` is answered, and statements keep their exact text (a
    /// sampled traceparent from a trusted proxy does not change that with `always_off`).
    @Test func samplingOffExportsNothingAndLeavesStatementsAlone() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(Self.userID)])
            let (receiver, daemon) = try await Self.start(database, sampler: "always_off")
            let traceID = Self.randomHex(bytes: 16)
            let query = try await Self.blockedReadQuery(database, daemon: daemon, traceID: traceID, flags: "01")
            #expect(!query.contains("traceparent") && !query.contains("/*"), "pg_stat_activity.query: \(query)")
            #expect(query.contains("profile_metrics_latest"))
            let response = try await Self.read(daemon, traceID: traceID, parentID: Self.randomHex(bytes: 8))
            #expect(response.status == .ok)
            #expect(response.headers[HTTPField.Name("traceparent")!] == nil)
            daemon.signal(SIGTERM)  // the exporter sends what it has on shutdown: nothing
            #expect(await daemon.waitForExit() == 0)
            #expect(receiver.spans.isEmpty, "exported: \(receiver.spans.map(\.name))")
            #expect(receiver.requests == 0)
        }
    }

    /// A client that is not a trusted proxy cannot choose to be sampled: its `traceparent` is ignored and the
    /// request's trace starts in metricsd (here with `parentbased_always_off`: not sampled, nothing exported).
    @Test func traceparentFromAnUntrustedClientIsIgnored() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(Self.userID)])
            let (receiver, daemon) = try await Self.start(
                database, sampler: "parentbased_always_off", trustProxy: false)
            let traceID = Self.randomHex(bytes: 16)
            let response = try await Self.read(daemon, traceID: traceID, parentID: Self.randomHex(bytes: 8))
            #expect(response.status == .ok)
            #expect(response.headers[HTTPField.Name("traceparent")!] == nil)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            #expect(!receiver.spans.contains { $0.traceID == traceID })
            #expect(receiver.spans.isEmpty)
        }
    }

    /// `check-config` refuses what tracing does not support, naming the variable and what to set.
    @Test func checkConfigRefusesAnUnsupportedProtocol() async throws {
        let files = try CommandLineTests.HostFiles(
            settings: "OTEL_TRACES_EXPORTER=otlp\nOTEL_EXPORTER_OTLP_PROTOCOL=grpc\n")
        let check = try await CommandLineTests.metricsd(["check-config"], files.environment)
        #expect(check.status == 78, "\(check)")
        #expect(check.stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "\(check.stderr)")
        #expect(check.stderr.contains("http/json"), "\(check.stderr)")
    }

    /// Holds an exclusive lock on `table` for three seconds while a read of `path` with a trusted `traceparent`
    /// waits for it, and returns the read's statement text (the one waiting that contains `marker`) as
    /// `pg_stat_activity` shows it.
    static func blockedReadQuery(
        _ database: TestDatabase, daemon: DaemonProcess, traceID: String, flags: String, path: String = Self.latestPath,
        table: String = "profile_metrics_latest", marker: String = "profile_metrics_latest"
    ) async throws -> String {
        // The user's row first (computed on request when the daily unit has not written it yet).
        _ = try await daemon.request(Self.latestPath, headers: TestTokens.bearer(TestTokens.user(Self.userID)))
        let lock = Task {
            try await database.execute(
                "BEGIN; LOCK TABLE \(table) IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3); COMMIT")
        }
        try await Task.sleep(for: .milliseconds(300))
        let read = Task {
            try await Self.read(daemon, traceID: traceID, parentID: Self.randomHex(bytes: 8), flags: flags, path: path)
        }
        var query: String?
        _ = await DaemonProcess.eventually(timeout: .seconds(3)) {
            query = try? await database.value(
                """
                SELECT query FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%\(marker)%'
                """)
            return query != nil
        }
        try await lock.value
        #expect(try await read.value.status == .ok)
        return try #require(query, "no read was seen waiting for the lock")
    }
}
