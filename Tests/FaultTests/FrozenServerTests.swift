import Foundation
import MetricsdTestSupport
import Synchronization
import Testing

/// The real `metricsd` binary against a database server that accepts TCP and never answers: a PostgreSQL whose
/// processes are all stopped with SIGSTOP (``ThrowawayCluster/freeze()``, always thawed again), or a relay that
/// stops relaying the connections open at one instant (``FreezingProxy``). Every wait the daemon has on a server is
/// bounded: no request waits longer than its bound plus a second, `/readyz` says 503 "database not answering" while
/// the primary is frozen and 200 again within two seconds of it answering, a read server that stops answering is
/// left (its reads answered by the primary) and the settings listener reconnects. Each case prints its figures.
@Suite(.serialized) struct FrozenServerTests {
    /// `METRICSD_DB_STATEMENT_DEADLINE_SECONDS` of these daemons: a request's bound.
    static let deadline = 3.0
    /// `/readyz`'s own bound (its probe's).
    static let readinessBound = 3.0
    /// What the targets allow beyond a bound.
    static let slack = 1.0

    /// One request on a new connection: its status (nil: no whole response within 30 s) and how long it took.
    struct Timed: Sendable {
        let status: Int?
        let seconds: Double
        let body: String
        /// When it was sent.
        var sent = ContinuousClock.now
        /// When its answer arrived.
        var answered: ContinuousClock.Instant { self.sent + .nanoseconds(Int64(self.seconds * 1e9)) }
    }

    static func timed(port: Int, path: String, token: String? = nil) async -> Timed {
        var headers = ["Connection": "close"]
        if let token { headers["Authorization"] = "Bearer \(token)" }
        return await Self.timed(port: port, request: RawHTTP.get(path, port: port, headers: headers))
    }

    /// One request (its whole text) on a new connection, its answer read for at most 30 s.
    static func timed(port: Int, request: String) async -> Timed {
        let started = ContinuousClock.now
        let connected = RawHTTP.connectedSocket(port: port)
        guard case .success(let descriptor) = connected else {
            return Timed(
                status: nil, seconds: (ContinuousClock.now - started).faultSeconds, body: "\(connected)", sent: started)
        }
        guard RawHTTP.send(descriptor, request) else {
            close(descriptor)
            return Timed(status: nil, seconds: (ContinuousClock.now - started).faultSeconds, body: "", sent: started)
        }
        let outcome = await RawHTTP.readResponses([descriptor], timeout: .seconds(30)).first  // closes it
        var body = outcome.map { "\($0)" } ?? "no outcome"
        if case .complete(_, let text)? = outcome { body = text }
        return Timed(
            status: outcome?.status, seconds: (ContinuousClock.now - started).faultSeconds, body: body, sent: started)
    }

    /// Requests to `path` until `until`, from `clients` clients at once, each `pause` after the previous answer.
    static func hammer(
        port: Int, path: String, tokens: [String?], clients: Int, until: ContinuousClock.Instant,
        pause: Duration = .zero
    ) async -> [Timed] {
        await withTaskGroup(of: [Timed].self) { group in
            for client in 0..<clients {
                group.addTask {
                    var answers: [Timed] = []
                    var turn = client
                    while ContinuousClock.now < until {
                        answers.append(await Self.timed(port: port, path: path, token: tokens[turn % tokens.count]))
                        turn += clients
                        try? await Task.sleep(for: pause)
                    }
                    return answers
                }
            }
            var all: [Timed] = []
            for await answers in group { all += answers }
            return all
        }
    }

    static func summary(_ answers: [Timed]) -> String {
        let statuses = Dictionary(grouping: answers, by: { $0.status.map(String.init) ?? "none" }).mapValues(\.count)
            .sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        let slowest = answers.map(\.seconds).max() ?? 0
        return "\(answers.count) answers (\(statuses)), slowest \(Fault.format(slowest)) s"
    }

    /// A daemon on `url` whose units are done, with `extra` settings.
    static func startDaemon(
        _ url: String, direct: String? = nil, name: String, extra: [String: String]
    ) async throws -> DaemonProcess {
        let database = FaultDatabase(url: direct ?? url)
        let dailyAt = try await Fault.dailyTime(database)
        var settings = [
            "METRICSD_DB_STATEMENT_DEADLINE_SECONDS": "\(Int(Self.deadline))", "METRICSD_TICK_SECONDS": "1",
        ]
        settings.merge(extra) { $1 }
        let daemon = try Fault.start(url, dailyAt: dailyAt, name: name, extra: settings)
        try await daemon.waitUntilReady()
        let done = await Fault.waitUntil(timeout: .seconds(90)) {
            try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
        }
        try #require(done != nil, "units not done:\n\(daemon.log.suffix(2000))")
        return daemon
    }

    /// The primary frozen for 12 s: `/readyz` says 503 "database not answering" within its bound, reads and an
    /// acknowledgement fail within theirs; within 2 s of the thaw `/readyz` is 200 again and reads are answered.
    @Test(.timeLimit(.minutes(4))) func frozenPrimary() async throws {
        let started = ContinuousClock.now
        try await withThrowawayCluster("frozen-primary") { cluster in
            try await cluster.start()
            try await Fault.migrate(cluster.url)
            try await FaultDatabase(url: cluster.url).execute(
                Fault.seedSQL(count: 500, zones: ["Asia/Kathmandu", "America/Havana"]))
            let daemon = try await Self.startDaemon(cluster.url, name: "metricsd-frozen", extra: [:])
            defer { daemon.signal(SIGKILL) }
            let tokens: [String?] = Fault.validUserIDs(500, count: 40).map { TestTokens.user($0) }
            let before = await Self.timed(port: daemon.port, path: "/v1/profile/metrics/today", token: tokens[0])
            #expect(before.status == 200, "before the freeze: \(before.status.map(String.init) ?? "none")")

            let (frozen, frozeAt, readyz, reads, acknowledgement, frozeFor) = try await withFrozen(cluster) { stopped in
                let frozeAt = ContinuousClock.now
                async let readyz = Self.hammer(
                    port: daemon.port, path: "/readyz", tokens: [nil], clients: 1, until: frozeAt + .seconds(10),
                    pause: .milliseconds(100))
                async let reads = Self.hammer(
                    port: daemon.port, path: "/v1/profile/metrics/today", tokens: tokens, clients: 6,
                    until: frozeAt + .seconds(10),
                    pause: .milliseconds(20))
                let acknowledgement = await Self.acknowledge(port: daemon.port, user: 1)
                let answers = (await readyz, await reads, acknowledgement)
                try await Task.sleep(until: frozeAt + .seconds(12))
                return (stopped, frozeAt, answers.0, answers.1, answers.2, (ContinuousClock.now - frozeAt).faultSeconds)
            }
            let thawed = ContinuousClock.now
            // A "ready" result is reused for up to a second (`/readyz` probes at most once a second): 200s may
            // answer requests sent in the first second of the freeze, none later.
            let cached = readyz.filter { $0.status == 200 }
            let firstUnready = readyz.first { $0.status == 503 }.map { ($0.answered - frozeAt).faultSeconds }
            let ready = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(50)) {
                await Self.timed(port: daemon.port, path: "/readyz").status == 200
            }
            let readySeconds = try #require(
                ready.map { ($0 - thawed).faultSeconds },
                "/readyz never 200 after the thaw:\n\(daemon.log.suffix(3000))")
            let after = await Self.timed(port: daemon.port, path: "/v1/profile/metrics/today", token: tokens[1])
            print(
                "frozen-primary: \(frozen) processes stopped for \(Fault.format(frozeFor)) s (statement deadline \(Int(Self.deadline)) s); /readyz \(Self.summary(readyz)), the first 503 \(firstUnready.map { Fault.format($0) } ?? "never") s after the freeze; reads \(Self.summary(reads)); an acknowledgement \(acknowledgement.status.map(String.init) ?? "none") in \(Fault.format(acknowledgement.seconds)) s; /readyz 200 \(Fault.format(readySeconds)) s after the thaw, a read then \(after.status.map(String.init) ?? "none") in \(Fault.format(after.seconds)) s"
            )
            #expect(
                !readyz.isEmpty
                    && readyz.allSatisfy { $0.status != nil && $0.seconds <= Self.readinessBound + Self.slack },
                "/readyz while frozen: \(Self.summary(readyz))")
            #expect(
                cached.allSatisfy { ($0.sent - frozeAt).faultSeconds <= 1.1 },
                "/readyz said 200 later than a second into the freeze: \(Self.summary(readyz))")
            #expect(
                firstUnready.map { $0 <= 1 + Self.readinessBound + Self.slack } ?? false,
                "the first 503 of /readyz came \(firstUnready.map { Fault.format($0) } ?? "never")")
            #expect(
                readyz.contains { $0.body.contains("database not answering") },
                "/readyz never said why: \(readyz.first?.body ?? "")")
            #expect(
                reads.count >= 6 && reads.allSatisfy { $0.status == 503 && $0.seconds <= Self.deadline + Self.slack },
                "reads while frozen: \(Self.summary(reads))")
            #expect(
                acknowledgement.status == 503 && acknowledgement.seconds <= Self.deadline + Self.slack,
                "acknowledgement while frozen: \(acknowledgement.status.map(String.init) ?? "none") in \(acknowledgement.seconds) s"
            )
            #expect(readySeconds <= 2, "/readyz 200 only \(readySeconds) s after the thaw")
            #expect(after.status == 200, "a read after the thaw: \(after.status.map(String.init) ?? "none")")
            #expect(daemon.process.isRunning)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
        }
        print("frozen-primary: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// `POST /v1/profile/metrics/acknowledge` of some row, timed.
    static func acknowledge(port: Int, user: Int64) async -> Timed {
        let body = #"{"version":1,"metricsComputedAt":"2020-01-01T00:00:00.000Z"}"#
        let request = """
            POST /v1/profile/metrics/acknowledge HTTP/1.1\r
            Host: 127.0.0.1:\(port)\r
            Connection: close\r
            Authorization: Bearer \(TestTokens.user(user))\r
            Content-Type: application/json\r
            Content-Length: \(body.utf8.count)\r
            \r
            \(body)
            """
        return await Self.timed(port: port, request: request)
    }

    /// A standby (read bound 2 s) frozen for 20 s under reads: every read is answered (by the primary) within the
    /// bound plus a second, the standby is shown unusable (`metricsd_read_server_usable 0`, reason not_answering,
    /// its lag growing) within the bound plus a second, `metricsd status` says why; read from again once thawed.
    @Test(.timeLimit(.minutes(5))) func frozenStandby() async throws {
        let started = ContinuousClock.now
        let bound = 2.0
        try await withStandbySet("frozen-standby", standbys: 1) { set in
            try await Fault.migrate(set.primaryURL)
            try await FaultDatabase(url: set.primaryURL).execute(
                Fault.seedSQL(count: 500, zones: ["Asia/Kathmandu", "America/Havana"]))
            let standby = set.standbys[0]
            let label = set.label(standby)
            let daemon = try await Self.startDaemon(
                set.primaryURL, name: "metricsd-frozen-standby",
                extra: [
                    "METRICSD_READ_DATABASE_URL": set.readURL, "METRICSD_READ_MAX_LAG_SECONDS": "\(Int(bound))",
                    "METRICSD_DB_STATEMENT_DEADLINE_SECONDS": "10",
                ])
            defer { daemon.signal(SIGKILL) }
            let inUse = await Fault.waitUntil(timeout: .seconds(30)) {
                try await StandbyReadTests.usable(daemon, label)
            }
            try #require(inUse != nil, "the standby was never used:\n\(daemon.log.suffix(2000))")
            let tokens: [String?] = Fault.validUserIDs(500, count: 40).map { TestTokens.user($0) }
            // Reads first, so that the standby's pool has sessions open when it freezes (a read then waits on one).
            let warm = await Self.hammer(
                port: daemon.port, path: "/v1/profile/metrics/today", tokens: tokens, clients: 6,
                until: .now + .seconds(2),
                pause: .milliseconds(20))
            #expect(warm.allSatisfy { $0.status == 200 }, "reads before the freeze: \(Self.summary(warm))")

            let (reads, leftSeconds, lagWhileFrozen, frozenFor, problem, status) = try await withFrozen(standby) { _ in
                let frozeAt = ContinuousClock.now
                async let reads = Self.hammer(
                    port: daemon.port, path: "/v1/profile/metrics/today", tokens: tokens, clients: 6,
                    until: frozeAt + .seconds(8),
                    pause: .milliseconds(20))
                let left = await Fault.waitUntil(timeout: .seconds(15), poll: .milliseconds(50)) {
                    try await !StandbyReadTests.usable(daemon, label)
                }
                let answers = await reads
                let series = try await PrometheusScrape.scrape(daemon)
                let frozenFor = (ContinuousClock.now - frozeAt).faultSeconds
                let lag = PrometheusScrape.value(series, "metricsd_read_server_lag_seconds", ["server": label]) ?? -1
                let problem = PrometheusScrape.value(
                    series, "metricsd_read_server_problem", ["server": label, "reason": "not_answering"])
                // The next heartbeat (every 10 s) carries it to `metricsd status`.
                var status = ""
                _ = await Fault.waitUntil(timeout: .seconds(25), poll: .seconds(1)) {
                    status = try await Self.status(set.primaryURL)
                    return status.contains("not answering")
                }
                return (answers, left.map { ($0 - frozeAt).faultSeconds }, lag, frozenFor, problem, status)
            }
            let thawed = ContinuousClock.now
            let back = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(50)) {
                try await StandbyReadTests.usable(daemon, label)
            }
            let backSeconds = try #require(
                back.map { ($0 - thawed).faultSeconds },
                "the thawed standby is not read from again:\n\(daemon.log.suffix(3000))")
            print(
                "frozen-standby: read bound \(Int(bound)) s; reads while frozen \(Self.summary(reads)); left \(leftSeconds.map { Fault.format($0) } ?? "never") s after the freeze, its lag \(Fault.format(lagWhileFrozen)) s after \(Fault.format(frozenFor)) s frozen; read from again \(Fault.format(backSeconds)) s after the thaw"
            )
            let late = reads.filter { $0.status != 200 || $0.seconds > bound + Self.slack }.prefix(5)
                .map {
                    "\($0.status.map(String.init) ?? "none") in \(Fault.format($0.seconds)) s: \($0.body.prefix(200))"
                }
            #expect(
                reads.count >= 6 && late.isEmpty,
                "reads while the standby was frozen: \(Self.summary(reads)); \(late)\n\(daemon.log.suffix(3000))")
            #expect(
                leftSeconds.map { $0 <= bound + Self.slack } ?? false,
                "the frozen standby was shown usable for \(leftSeconds.map { Fault.format($0) } ?? "ever")")
            #expect(
                problem == 1,
                "metricsd_read_server_problem{reason=\"not_answering\"}: \(problem.map { "\($0)" } ?? "absent")")
            #expect(lagWhileFrozen >= frozenFor - bound, "lag \(lagWhileFrozen) s after \(frozenFor) s frozen")
            #expect(
                status.contains(label) && status.contains("not answering"), "metricsd status while frozen:\n\(status)")
            #expect(daemon.log.contains("Not reading from read server"))
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
        }
        print("frozen-standby: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// `metricsd status` against `url`: its output.
    static func status(_ url: String) async throws -> String {
        try await Subprocess.run(
            try DaemonProcess.binary(), ["status"],
            environment: [
                "DATABASE_URL": url, "METRICSD_ENV_FILE": "-/nonexistent", "METRICSD_CREDSTORE": "/nonexistent",
            ]
        ).output
    }

    /// The settings listener's LISTEN session stops answering (the relay in front of the server stops relaying it,
    /// every other connection works): the listener notices, reconnects and sweeps, so a change made meanwhile is
    /// recomputed within seconds, and the next one within a second of its NOTIFY — not at the next 30 s sweep.
    @Test(.timeLimit(.minutes(4))) func frozenSettingsListener() async throws {
        let started = ContinuousClock.now
        try await withThrowawayCluster("frozen-listener") { cluster in
            try await cluster.start()
            try await Fault.migrate(cluster.url)
            let database = FaultDatabase(url: cluster.url)
            try await database.execute(Fault.seedSQL(count: 200, zones: ["Asia/Kathmandu", "America/Havana"]))
            try await withFreezingProxy(to: cluster.port) { proxy in
                let url = "postgresql://postgres@127.0.0.1:\(proxy.port)/postgres?sslmode=disable"
                let daemon = try await Self.startDaemon(
                    url, direct: cluster.url, name: "metricsd-frozen-listener", extra: [:])
                defer { daemon.signal(SIGKILL) }
                let baseline = try await FailoverTests.changeAndWait(database, user: 1, weight: "81.25")
                #expect(
                    baseline.map { $0 < 2 } ?? false,
                    "a settings change before the freeze took \(baseline.map { Fault.format($0) } ?? "ever") s")
                // The listener's session: its last statement is the LISTEN, the first watermark's query, or a check
                // of the session (`pg_listening_channels()`).
                let port = try #require(
                    try await database.value(
                        """
                        SELECT client_port FROM pg_stat_activity
                        WHERE application_name = 'metricsd-frozen-listener'
                          AND (query ILIKE '%listen%' OR query ILIKE '%interval ''10 minutes''%')
                        """
                    ).flatMap { Int($0) },
                    "no LISTEN session of the daemon:\n\(daemon.log.suffix(2000))")
                try #require(proxy.freeze(serverSidePort: port), "the relay has no connection from port \(port)")
                let frozeAt = ContinuousClock.now
                try await Task.sleep(for: .seconds(1))
                let during = try await FailoverTests.changeAndWait(
                    database, user: 3, weight: "82.5", timeout: .seconds(20))
                let next = try await FailoverTests.changeAndWait(
                    database, user: 5, weight: "83.75", timeout: .seconds(20))
                let relistened = try await database.int(
                    """
                    SELECT count(*) FROM pg_stat_activity
                    WHERE application_name = 'metricsd-frozen-listener' AND client_port <> \(port)
                      AND (query ILIKE '%listen%' OR query ILIKE '%interval ''10 minutes''%')
                    """)
                print(
                    "frozen-listener: before the freeze a change was recomputed in \(baseline.map { Fault.format($0) } ?? "never") s; with the LISTEN session frozen, a change made 1 s later in \(during.map { Fault.format($0) } ?? "never") s, the next one in \(next.map { Fault.format($0) } ?? "never") s; new LISTEN sessions: \(relistened); \(Fault.format((ContinuousClock.now - frozeAt).faultSeconds)) s since the freeze"
                )
                #expect(
                    during.map { $0 <= 12 } ?? false,
                    "a change made while the LISTEN session was frozen took \(during.map { Fault.format($0) } ?? "over 20") s:\n\(daemon.log.suffix(3000))"
                )
                #expect(
                    next.map { $0 <= 2 } ?? false,
                    "the next change took \(next.map { Fault.format($0) } ?? "over 20") s: notifications still lost")
                #expect(relistened == 1, "LISTEN sessions besides the frozen one: \(relistened)")
                #expect(daemon.log.contains("Settings listener disconnected; retrying"), "the listener never noticed")
                daemon.signal(SIGTERM)
                #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
            }
        }
        print("frozen-listener: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }
}
