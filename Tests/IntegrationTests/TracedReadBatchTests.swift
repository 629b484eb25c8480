import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdTestSupport
import Testing

/// Sampled latest reads that share one batched statement, through the real binary, a real OTLP receiver and the
/// test server's own log: the statement stays the prepared one (PostgreSQL logs `execute latest_metrics_batch`,
/// never `execute <unnamed>` with a comment), and its span still holds every request's trace — a child of one
/// request's span, linked to each other's — on the primary and through a read server.
@Suite struct TracedReadBatchTests {
    static let users: [Int64] = (1...8).map { 4_712_000 + $0 }

    @Test func sampledBatchOnThePrimaryKeepsItsPreparedStatement() async throws {
        try await withTestDatabase { database in
            try await Self.checkBatch(database, readServer: false)
        }
    }

    /// The same with the reads on a read server (`METRICSD_READ_DATABASE_URL`: the test server itself, which a
    /// daemon reads from as the primary it is).
    @Test func sampledBatchOnAReadServerLinksEveryRequest() async throws {
        try await withTestDatabase { database in
            try await Self.checkBatch(database, readServer: true)
        }
    }

    /// Eight users' rows; a traced daemon sampling everything (with a read server when asked); the test database
    /// logging every statement. Then eight sampled reads held back by a lock on `profile_metrics_latest` run as
    /// few batches: every latest-read statement in the log is named, one is `latest_metrics_batch`, and the
    /// statement spans' parents and links cover every request's server span.
    static func checkBatch(_ database: TestDatabase, readServer: Bool) async throws {
        try await database.seed(Self.users.map { SeedUser.valid($0) })
        try await database.execute("ALTER DATABASE \"\(database.name)\" SET log_min_duration_statement = 0")
        let more = readServer ? ["METRICSD_READ_DATABASE_URL": database.url] : [:]
        let (receiver, daemon) = try await TracingTests.start(database, sampler: "always_on", more: more)
        for user in Self.users {  // every row written (by the daily unit or on request) before the batch
            let first = try await daemon.request(
                TracingTests.latestPath, headers: TestTokens.bearer(TestTokens.user(user)))
            try #require(first.status == .ok, "\(first.text)")
        }
        if readServer {
            let usable = try await DaemonProcess.eventually(timeout: .seconds(20)) {
                PrometheusScrape.value(try await PrometheusScrape.scrape(daemon), "metricsd_read_server_usable") == 1
            }
            try #require(usable, "the read server was never usable")
        }
        let log = try await ServerLog(database)
        let readsBefore = try await Self.readServerReads(daemon)

        let servers = try await Self.heldBackReads(database, daemon: daemon)

        // PostgreSQL's log: every latest read of the batch ran the named statement, without a comment.
        let reads = try log.entriesSince().filter {
            $0.contains("FROM unnest($1::bigint[]) AS u(id)") || $0.contains("WHERE pm.user_id = $1")
        }
        #expect(reads.contains { $0.contains("execute latest_metrics_batch:") }, "latest reads logged: \(reads)")
        for entry in reads {
            #expect(!entry.contains("<unnamed>") && !entry.contains("traceparent"), "sent unnamed: \(entry)")
        }
        if readServer {
            #expect(
                try await Self.readServerReads(daemon) - readsBefore >= Double(Self.users.count),
                "not read on the read server")
        }

        // The trace: each batch's statement span is a child of one request's server span and linked to the others.
        let traceIDs = Set(servers.map(\.traceID))
        let statements = await receiver.spans { spans in
            Self.covered(spans.filter { $0.kind == 3 && traceIDs.contains($0.traceID) }, servers)
                == Set(servers.map(\.link))
        }.filter { $0.kind == 3 && traceIDs.contains($0.traceID) }
        #expect(
            Self.covered(statements, servers) == Set(servers.map(\.link)),
            "statements: \(statements.map { ($0.name, $0.parentSpanID, $0.links) })")
        #expect(statements.contains { $0.name == "latest_metrics_batch" && !$0.links.isEmpty })
        for statement in statements {
            #expect(statement.name.hasPrefix("latest_metrics"))
            #expect(servers.contains { $0.traceID == statement.traceID && $0.spanID == statement.parentSpanID })
        }
        daemon.signal(SIGTERM)
        #expect(await daemon.waitForExit() == 0)
    }

    /// A request's server span as its answer's `traceparent` names it.
    struct ServerSpan: Hashable {
        let traceID: String
        let spanID: String
        var link: String { "\(self.traceID)/\(self.spanID)" }
    }

    /// Every server span some statement span is a child of or linked to, as `traceId/spanId`.
    static func covered(_ statements: [OTLPReceiver.ReceivedSpan], _ servers: [ServerSpan]) -> Set<String> {
        var covered = Set<String>()
        for statement in statements {
            covered.insert("\(statement.traceID)/\(statement.parentSpanID)")
            covered.formUnion(statement.links)
        }
        return covered.intersection(servers.map(\.link))
    }

    /// One sampled read per user while the test holds an exclusive lock on `profile_metrics_latest` for two seconds:
    /// the runners' first batches wait for it, the rest queue and go as one batch. Each read's server span.
    static func heldBackReads(_ database: TestDatabase, daemon: DaemonProcess) async throws -> [ServerSpan] {
        let lock = Task {
            try await database.execute(
                "BEGIN; LOCK TABLE profile_metrics_latest IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(2); COMMIT")
        }
        try await Task.sleep(for: .milliseconds(300))
        let servers = try await withThrowingTaskGroup(of: ServerSpan.self) { group in
            for user in Self.users {
                group.addTask {
                    let traceID = TracingTests.randomHex(bytes: 16)
                    let response = try await TracingTests.read(
                        daemon, traceID: traceID, parentID: TracingTests.randomHex(bytes: 8), userID: user)
                    #expect(response.status == .ok, "\(response.text)")
                    let answered = try #require(response.headers[HTTPField.Name("traceparent")!])
                    let parts = answered.split(separator: "-").map(String.init)
                    try #require(parts.count == 4 && parts[1] == traceID)
                    return ServerSpan(traceID: traceID, spanID: parts[2])
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        try await lock.value
        return servers
    }

    /// Users read on the read server so far (`metricsd_read_server_reads_total` but the primary's series).
    static func readServerReads(_ daemon: DaemonProcess) async throws -> Double {
        try await PrometheusScrape.scrape(daemon).filter { key, _ in
            key.hasPrefix("metricsd_read_server_reads_total{") && !key.contains(#"server="primary""#)
        }.values.reduce(0, +)
    }

    /// The test server's log (`log/postgresql.log` beside its data directory, as `scripts/pg-cluster` lays a
    /// cluster out), read from where it ended when made.
    struct ServerLog {
        let path: String
        let start: UInt64

        init(_ database: TestDatabase) async throws {
            let data = try #require(try await database.value("SHOW data_directory"))
            self.path =
                URL(fileURLWithPath: data).deletingLastPathComponent().appendingPathComponent("log/postgresql.log").path
            let attributes = try FileManager.default.attributesOfItem(atPath: self.path)
            self.start = try #require((attributes[.size] as? NSNumber)?.uint64Value)
        }

        /// The entries written since: each starts with a line beginning with the date (`log_line_prefix`'s `%m`)
        /// and goes on over the statement's lines.
        func entriesSince() throws -> [String] {
            let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: self.path))
            defer { try? handle.close() }
            try handle.seek(toOffset: self.start)
            let text = String(decoding: try handle.readToEnd() ?? Data(), as: UTF8.self)
            var entries: [String] = []
            for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
                if line.prefix(2) == "20" || entries.isEmpty {
                    entries.append(String(line))
                } else {
                    entries[entries.count - 1] += "\n" + line
                }
            }
            return entries
        }
    }
}
