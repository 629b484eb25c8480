import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdPostgres
import MetricsdTestSupport
import Synchronization
import Testing

/// The real binary behind Debian's PgBouncer (stock, as `scripts/pg-cluster pgbouncer` starts it) in transaction
/// and session mode: nothing in the startup packet it refuses, unnamed statements where server sessions are shared
/// (0 prepared-statement errors), migrations that take turns through it, LISTEN on a notification URL past it or
/// polling (and saying so), and exactly once across a SIGKILL mid-unit.
@Suite(.serialized) struct PoolerTests {
    /// Two daemons and the CLI through PgBouncer in transaction mode, LISTEN on the server itself: 2,000 latest
    /// reads all 200, settings changes visible within 1 s, `recompute-all --wait` exits 0, no prepared-statement
    /// error anywhere, no notification PgBouncer had to drop.
    @Test(.timeLimit(.minutes(4))) func transactionModeServesReadsSettingsAndRecompute() async throws {
        try await withTestDatabase { database in
            try await withPgBouncer(.transaction) { bouncer in
                let zone = try #require(
                    try await database.value(
                        """
                        SELECT name FROM pg_timezone_names
                        WHERE name IN ('UTC', 'Asia/Tokyo', 'America/New_York', 'Asia/Kolkata', 'America/Los_Angeles')
                          AND (now() AT TIME ZONE name)::time BETWEEN time '01:00' AND time '22:00'
                        ORDER BY name LIMIT 1
                        """))
                try await database.seedWithVersion1(count: 2_000, zones: [zone])
                try await database.execute(
                    """
                    SET session_replication_role = replica;
                    UPDATE user_settings SET updated_at = now() - interval '1 day';
                    SET session_replication_role = DEFAULT;
                    """)
                let pooled = bouncer.url(database: database.name)
                let extra = [
                    "METRICSD_NOTIFY_DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2",
                    "METRICSD_DAILY_AT": "23:59", "METRICSD_CHUNK_SIZE": "500",
                ]
                let daemons = try (0..<2).map { _ in try Self.start(pooled, extra: extra) }
                defer { for daemon in daemons { daemon.signal(SIGKILL) } }
                for daemon in daemons { try await daemon.waitUntilReady() }
                for daemon in daemons {
                    let ready = try await daemon.request("/readyz").json()
                    #expect(ready["notifications"] as? String == "listening", "\(ready)")
                }
                let failed = try await Self.reads(2_000, daemons: daemons, users: 1...1_999)
                #expect(failed.isEmpty, "non-200 answers: \(failed.prefix(10))")
                for user in [7, 11, 13] {
                    let seconds = try await Self.changeAndWait(database, user: user)
                    #expect(
                        seconds != nil && seconds! < 1,
                        "user \(user): settings change visible after \(String(describing: seconds)) s")
                }
                let started = ContinuousClock.now
                let cli = try await Subprocess.run(
                    try DaemonProcess.binary(), ["recompute-all", "--wait"],
                    environment: [
                        "DATABASE_URL": pooled, "METRICSD_NOTIFY_DATABASE_URL": database.url,
                        "METRICSD_TEST_FORMULA_VERSION": "2",
                    ])
                #expect(cli.status == 0, "\(cli.output)")
                print("pooler-transaction: recompute-all --wait \(ContinuousClock.now - started)")
                for daemon in daemons {
                    daemon.signal(SIGTERM)
                    #expect(await daemon.waitForExit() == 0)
                }
                let logs = daemons.map(\.log).joined() + cli.output
                #expect(!logs.contains("prepared statement"), "\(logs.suffix(3000))")
                #expect(
                    !bouncer.log.contains("when not linked"),
                    "PgBouncer dropped notifications:\n\(bouncer.log.suffix(2000))")
                #expect(
                    try await database.value(
                        "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                    ) == "0")
            }
        }
    }

    /// Without a notification URL the daemon does not LISTEN through the pooler: it polls every
    /// METRICSD_IDLE_POLL_SECONDS, says so (log, `/readyz`, `/metrics`), and settings changes show within that.
    @Test(.timeLimit(.minutes(3))) func transactionModeWithoutNotifyURLPolls() async throws {
        try await withTestDatabase { database in
            try await withPgBouncer(.transaction) { bouncer in
                try await database.execute(Fault.seedSQL(count: 200, zones: ["UTC"]))
                let daemon = try Self.start(
                    bouncer.url(database: database.name), extra: ["METRICSD_IDLE_POLL_SECONDS": "1"])
                defer { daemon.signal(SIGKILL) }
                try await daemon.waitUntilReady()
                let computed = await DaemonProcess.eventually(timeout: .seconds(60)) {
                    (try? await database.value("SELECT count(*) FROM profile_metrics WHERE user_id IN (3, 5)")) == "2"
                }
                try #require(computed, "\(daemon.log.suffix(2000))")
                let polling = await DaemonProcess.eventually(timeout: .seconds(10)) {
                    ((try? await daemon.request("/readyz").json())?["notifications"] as? String)?.hasPrefix(
                        "polling every 1 s: DATABASE_URL goes through a connection pooler") == true
                }
                let readyz = (try? await daemon.request("/readyz").text) ?? ""
                #expect(polling, "\(readyz)")
                #expect(
                    daemon.log.contains("Notifications do not arrive; polling for settings changes"),
                    "\(daemon.log.suffix(2000))")
                let scraped = try await PrometheusScrape.scrape(daemon)
                #expect(PrometheusScrape.value(scraped, "metricsd_notifications_usable", [:]) == 0)
                for user in [3, 5] {
                    let seconds = try await Self.changeAndWait(database, user: user)
                    // One poll interval, plus the refresh itself.
                    #expect(
                        seconds != nil && seconds! < 1.5,
                        "user \(user): settings change visible after \(String(describing: seconds)) s")
                }
                daemon.signal(SIGTERM)
                #expect(await daemon.waitForExit() == 0)
                #expect(!daemon.log.contains("prepared statement"), "\(daemon.log.suffix(3000))")
                #expect(!bouncer.log.contains("when not linked"), "\(bouncer.log.suffix(2000))")
            }
        }
    }

    /// Two daemons through the pooler, one killed (SIGKILL) in the middle of a daily unit: exactly one row per
    /// valid user, no lease taken over while live (``Invariant``).
    @Test(.timeLimit(.minutes(4))) func transactionModeKillMidUnitExactlyOnce() async throws {
        try await withTestDatabase { testDatabase in
            try await withPgBouncer(.transaction) { bouncer in
                let database = FaultDatabase(url: testDatabase.url)
                try await database.installAudit()
                try await database.execute(Fault.seedSQL(count: 6000, zones: ["Asia/Kathmandu", "America/Havana"]))
                let dailyAt = try await Fault.dailyTime(database)
                let extra = [
                    "METRICSD_LEASE_SECONDS": "4", "METRICSD_TICK_SECONDS": "1", "METRICSD_CHUNK_SIZE": "2000",
                    "METRICSD_BATCH_SIZE": "100", "METRICSD_FAULTS": "batch-delay-ms=60", "METRICSD_WORKERS": "2",
                    "METRICSD_NOTIFY_DATABASE_URL": testDatabase.url,
                ]
                let pooled = bouncer.url(database: testDatabase.name)
                let a = try Fault.start(pooled, dailyAt: dailyAt, extra: extra)
                let b = try Fault.start(pooled, dailyAt: dailyAt, extra: extra)
                defer { for daemon in [a, b] { daemon.signal(SIGKILL) } }
                let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                    let running = try await database.int(
                        "SELECT count(*) FROM work_chunks WHERE state = 'running' AND lease_owner IS NOT NULL AND cursor_user_id > range_start"
                    )
                    let rows = try await database.int("SELECT count(*) FROM profile_metrics")
                    return running >= 2 && rows >= 800
                }
                try #require(midway != nil, "the unit did not get under way:\n\(a.log.suffix(2000))")
                a.signal(SIGKILL)
                #expect(await a.waitForExit() != 0)
                let done = await Fault.waitUntil(timeout: .seconds(120)) {
                    try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
                }
                #expect(done != nil, "units not done:\n\(b.log.suffix(2000))")
                #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")
                b.signal(SIGTERM)
                #expect(await b.waitForExit() == 0)
                let report = try await Invariant.check(
                    database, scenario: "pooler-kill-9-daily", faults: 1, dailyVersion: 1)
                report.assertHolds()
                #expect(!(a.log + b.log).contains("prepared statement"), "\((a.log + b.log).suffix(3000))")
            }
        }
    }

    /// A recompute-all job (formula version 2) through the pooler, its daemon killed (SIGKILL) in the middle and
    /// another started: the job resumes from the chunks' cursors and ends with one version-2 row per valid user
    /// (``Invariant``); then acknowledgements of those rows through the pooler are stored, and a second one of the
    /// same row is idempotent. No prepared-statement error anywhere.
    @Test(.timeLimit(.minutes(4))) func transactionModeRecomputeKilledResumedAndAcknowledged() async throws {
        try await withTestDatabase { testDatabase in
            try await withPgBouncer(.transaction) { bouncer in
                let database = FaultDatabase(url: testDatabase.url)
                try await database.installAudit()
                let zones = ["Europe/Paris", "Pacific/Chatham"]
                try await database.execute(Fault.seedSQL(count: 4000, zones: zones))
                let dailyAt = try await Fault.dailyTime(database)
                try await Fault.leaveVersion2ToTheJob(database, zones: zones)
                let pooled = bouncer.url(database: testDatabase.name)
                let extra = [
                    "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_LEASE_SECONDS": "4", "METRICSD_TICK_SECONDS": "1",
                    "METRICSD_CHUNK_SIZE": "2000", "METRICSD_BATCH_SIZE": "100", "METRICSD_FAULTS": "batch-delay-ms=60",
                    "METRICSD_WORKERS": "2", "METRICSD_NOTIFY_DATABASE_URL": testDatabase.url,
                ]
                let trigger = try await Subprocess.run(
                    try DaemonProcess.binary(), ["recompute-all"],
                    environment: [
                        "DATABASE_URL": pooled, "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_CHUNK_SIZE": "2000",
                    ])
                try #require(trigger.status == 0, "\(trigger.output)")

                let a = try Fault.start(pooled, dailyAt: dailyAt, extra: extra)
                defer { a.signal(SIGKILL) }
                let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                    let running = try await database.int(
                        "SELECT count(*) FROM work_chunks WHERE kind = 'recompute' AND state = 'running' AND cursor_user_id > range_start"
                    )
                    let rows = try await database.int("SELECT count(*) FROM profile_metrics WHERE version = 2")
                    return running == 2 && rows >= 800
                }
                try #require(midway != nil, "the job did not get under way:\n\(a.log.suffix(2000))")
                a.signal(SIGKILL)
                #expect(await a.waitForExit() != 0)
                #expect(try await database.value("SELECT state FROM recompute_jobs") == "running")

                let b = try Fault.start(pooled, dailyAt: dailyAt, extra: extra)
                defer { b.signal(SIGKILL) }
                let done = await Fault.waitUntil(timeout: .seconds(90)) {
                    try await database.value("SELECT state FROM recompute_jobs") == "done"
                }
                #expect(done != nil, "job not done:\n\(b.log.suffix(2000))")
                #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")
                try await b.waitUntilReady()

                let users = Array(Fault.validUserIDs(4000, count: 20))
                for user in users {
                    let today = try await b.request(
                        "/v1/profile/metrics/today", headers: TestTokens.bearer(TestTokens.user(user)))
                    try #require(today.status == .ok, "user \(user): \(today.status) \(today.text)")
                    let metrics = try #require(try today.json()["data"] as? [String: Any])["metrics"] as? [String: Any]
                    let version = try #require(metrics?["version"] as? Int)
                    let computedAt = try #require(metrics?["computedAt"] as? String)
                    #expect(version == 2)
                    let body = #"{"version":\#(version),"metricsComputedAt":"\#(computedAt)"}"#
                    let headers = TestTokens.bearer(TestTokens.user(user)).merging([.contentType: "application/json"])
                    for attempt in 0..<2 {
                        let ack = try await b.request(
                            "/v1/profile/metrics/acknowledge", method: .post, headers: headers, body: body)
                        #expect(
                            ack.status == .ok, "user \(user), acknowledgement \(attempt + 1): \(ack.status) \(ack.text)"
                        )
                    }
                }
                let stored = try await database.int(
                    """
                    SELECT count(*) FROM metrics_acknowledgements a JOIN profile_metrics pm
                      ON pm.user_id = a.user_id AND pm.version = a.version AND pm.computed_at = a.metrics_computed_at
                    WHERE a.version = 2 AND a.user_id IN (\(users.map(String.init).joined(separator: ",")))
                    """)
                #expect(stored == users.count, "acknowledgements stored for the rows read: \(stored) of \(users.count)")
                b.signal(SIGTERM)
                #expect(await b.waitForExit() == 0)
                try await Invariant.check(database, scenario: "pooler-kill-9-recompute", faults: 1).assertHolds()
                #expect(
                    !(a.log + b.log + trigger.output).contains("prepared statement"), "\((a.log + b.log).suffix(3000))")
                #expect(!bouncer.log.contains("when not linked"), "\(bouncer.log.suffix(2000))")
            }
        }
    }

    /// Two `metricsd migrate` at once through the pooler on an empty database, three rounds: both exit 0, every
    /// migration applied once, and no advisory lock left held on a pooled server session. Without a session past
    /// the pooler, the first migration outside a transaction stops with an error naming the setting, and leaves
    /// no claim behind.
    @Test(.timeLimit(.minutes(4))) func migrationsRacingThroughThePoolerTakeTurns() async throws {
        try await withPgBouncer(.transaction) { bouncer in
            let name = "pooler_migrate_0_" + UUID().uuidString.prefix(8).lowercased()
            try await TestDatabase.admin { try $0.execute("CREATE DATABASE \(name)") }
            let refused = try await Subprocess.run(
                try DaemonProcess.binary(), ["migrate"], environment: ["DATABASE_URL": bouncer.url(database: name)])
            #expect(refused.status == 1)
            #expect(
                refused.output.contains("set METRICSD_NOTIFY_DATABASE_URL to PostgreSQL itself"), "\(refused.output)")
            let leftover = FaultDatabase(url: TestDatabase.url(try TestDatabase.serverURL(), database: name))
            #expect(try await leftover.int("SELECT count(*) FROM metricsd_migration_claims") == 0)
            _ = try? await Subprocess.run(
                bouncer.script, ["pgbouncer", "admin", bouncer.directory, "-c", "KILL \(name)"])
            try? await TestDatabase.admin { try $0.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
            for round in 1...3 {
                let name = "pooler_migrate_\(round)_" + UUID().uuidString.prefix(8).lowercased()
                try await TestDatabase.admin { try $0.execute("CREATE DATABASE \(name)") }
                let url = bouncer.url(database: name)
                let binary = try DaemonProcess.binary()
                let direct = TestDatabase.url(try TestDatabase.serverURL(), database: name)
                let environment = ["DATABASE_URL": url, "METRICSD_NOTIFY_DATABASE_URL": direct]
                async let first = Subprocess.run(binary, ["migrate"], environment: environment)
                async let second = Subprocess.run(binary, ["migrate"], environment: environment)
                let results = try await [first, second]
                for result in results { #expect(result.status == 0, "round \(round): \(result.output)") }
                let database = FaultDatabase(url: direct)
                #expect(try await database.int("SELECT count(*) FROM metricsd_migrations") == Migration.all.count)
                #expect(try await database.int("SELECT count(*) FROM metricsd_migration_claims") == 0)
                let held = try await database.int(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = x'6d657472'::int")
                #expect(held == 0, "round \(round): the migration lock is still held")
                _ = try? await Subprocess.run(
                    bouncer.script, ["pgbouncer", "admin", bouncer.directory, "-c", "KILL \(name)"])
                try? await TestDatabase.admin { try $0.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
            }
        }
    }

    /// Session mode: one server session per client, so a LISTEN on it works when named as the notification URL;
    /// reads and a settings change through it.
    @Test(.timeLimit(.minutes(3))) func sessionModeSmoke() async throws {
        try await withTestDatabase { database in
            try await withPgBouncer(.session) { bouncer in
                try await database.execute(Fault.seedSQL(count: 200, zones: ["UTC"]))
                let pooled = bouncer.url(database: database.name)
                let daemon = try Self.start(pooled, extra: ["METRICSD_NOTIFY_DATABASE_URL": pooled])
                defer { daemon.signal(SIGKILL) }
                try await daemon.waitUntilReady()
                let computed = await DaemonProcess.eventually(timeout: .seconds(60)) {
                    (try? await database.value("SELECT count(*) FROM profile_metrics")) == "196"
                }
                try #require(computed, "\(daemon.log.suffix(2000))")
                #expect((try await daemon.request("/readyz").json())["notifications"] as? String == "listening")
                let failed = try await Self.reads(200, daemons: [daemon], users: 1...49)
                #expect(failed.isEmpty, "non-200 answers: \(failed.prefix(10))")
                let seconds = try await Self.changeAndWait(database, user: 3)
                #expect(
                    seconds != nil && seconds! < 1, "settings change visible after \(String(describing: seconds)) s")
                daemon.signal(SIGTERM)
                #expect(await daemon.waitForExit() == 0)
                #expect(!daemon.log.contains("prepared statement"))
            }
        }
    }

    /// `metricsd check-config` through PgBouncer in transaction mode: it finds the pooler and that it shares server
    /// sessions and does not carry named statements; `METRICSD_DB_PREPARED_STATEMENTS=named` and an `options` in
    /// the string are problems naming what to change, no notification URL a warning; session mode is no problem.
    @Test(.timeLimit(.minutes(2))) func checkConfigRecognisesAPoolerItCannotWorkWithAsConfigured() async throws {
        try await withTestDatabase { database in
            try await withPgBouncer(.transaction) { bouncer in
                let pooled = bouncer.url(database: database.name)
                let named = try await Self.checkConfig(pooled, extra: ["METRICSD_DB_PREPARED_STATEMENTS": "named"])
                #expect(named.status == 78, "\(named.output)")  // EX_CONFIG
                #expect(
                    named.output.contains(
                        "shares server sessions between clients (transaction pooling); it does not carry named statements"
                    ), "\(named.output)")
                #expect(
                    named.output.contains(
                        "METRICSD_DB_PREPARED_STATEMENTS: named prepared statements fail through this pooler"),
                    "\(named.output)")
                #expect(
                    named.output.contains(
                        "warning: METRICSD_NOTIFY_DATABASE_URL: not set while DATABASE_URL goes through a pooler"),
                    "\(named.output)")
                let options = try await Self.checkConfig(pooled + "&options=-c%20jit%3Doff", extra: [:])
                #expect(options.status == 78)
                #expect(
                    options.output.contains("unsupported startup parameter")
                        && options.output.contains("remove options from DATABASE_URL"), "\(options.output)")
                let auto = try await Self.checkConfig(pooled, extra: ["METRICSD_NOTIFY_DATABASE_URL": database.url])
                #expect(auto.status == 0, "\(auto.output)")
            }
            try await withPgBouncer(.session) { bouncer in
                let session = try await Self.checkConfig(
                    bouncer.url(database: database.name), extra: ["METRICSD_DB_PREPARED_STATEMENTS": "named"])
                #expect(
                    session.output.contains("keeps a server session per client (session pooling)"), "\(session.output)")
                #expect(!session.output.contains("named prepared statements fail"), "\(session.output)")
            }
        }
    }

    static func checkConfig(_ url: String, extra: [String: String]) async throws -> (status: Int32, output: String) {
        var environment = DaemonProcess.environment(databaseURL: url, port: DaemonProcess.freePort(), extra: extra)
        environment["METRICSD_LISTEN"] = "127.0.0.1:\(DaemonProcess.freePort())"
        return try await Subprocess.run(try DaemonProcess.binary(), ["check-config"], environment: environment)
    }

    // MARK: Tools

    static func start(_ url: String, extra: [String: String]) throws -> DaemonProcess {
        let port = DaemonProcess.freePort()
        return try DaemonProcess(
            environment: DaemonProcess.environment(databaseURL: url, port: port, extra: extra), port: port)
    }

    /// `count` latest reads, 8 at a time, spread over `daemons` and `users` (every 50th user has no row: skipped);
    /// the statuses that were not 200.
    static func reads(_ count: Int, daemons: [DaemonProcess], users: ClosedRange<Int64>) async throws -> [String] {
        let ids = users.filter { $0 % 50 != 0 }
        return try await withThrowingTaskGroup(of: [String].self) { group in
            for worker in 0..<8 {
                group.addTask {
                    var failed: [String] = []
                    for index in stride(from: worker, to: count, by: 8) {
                        let id = ids[index % ids.count]
                        let response = try await daemons[index % daemons.count].request(
                            "/v1/profile/metrics/today", headers: TestTokens.bearer(TestTokens.user(id)))
                        if response.status != .ok {
                            failed.append("\(id): \(response.status) \(response.text.prefix(200))")
                        }
                    }
                    return failed
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    /// Changes a user's weight and waits (up to 10 s) until their newest row is recomputed; the seconds it took.
    static func changeAndWait(_ database: some PoolerTestDatabase, user: Int) async throws -> Double? {
        let newest = "SELECT max(computed_at)::text FROM profile_metrics WHERE user_id = \(user)"
        let before = try await database.scalar(newest)
        let changed = ContinuousClock.now
        try await database.run(
            "UPDATE user_settings SET current_weight = 45 + (current_weight + 0.25) % 80 WHERE user_id = \(user)")
        let refreshed = await Fault.waitUntil(timeout: .seconds(10), poll: .milliseconds(20)) {
            try await database.scalar(newest) != before
        }
        return refreshed.map { ($0 - changed).faultSeconds }
    }
}

/// The two kinds of test database handle the tools take.
protocol PoolerTestDatabase: Sendable {
    func scalar(_ sql: String) async throws -> String?
    func run(_ sql: String) async throws
}

extension TestDatabase: PoolerTestDatabase {
    func scalar(_ sql: String) async throws -> String? { try await self.value(sql) }
    func run(_ sql: String) async throws { try await self.execute(sql) }
}

/// Runs `body` with a PgBouncer in `mode` in front of the test server, destroyed afterwards whatever happens.
func withPgBouncer<T>(
    _ mode: PgBouncer.Mode, lines: [String] = [], _ body: (PgBouncer) async throws -> T
) async throws -> T {
    let bouncer = try await PgBouncer.start(
        mode.rawValue, upstreamPort: try TestDatabase.serverPort(), mode: mode, lines: lines)
    do {
        let value = try await body(bouncer)
        await bouncer.destroy()
        return value
    } catch {
        await bouncer.destroy()
        throw error
    }
}
