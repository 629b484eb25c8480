import Foundation
import HTTPTypes
import HealthMetrics
import HummingbirdTesting
import Logging
import MetricsdPostgres
import MetricsdTestSupport
import NIOPosix
import Synchronization
import Testing

/// The real `metricsd` binary and the real PostgreSQL under faults — killed daemons, a restarted database,
/// cut connections, racing instances, SIGTERM mid-chunk, HTTP overload, bad data at scale and a database out of
/// connections. Every scenario ends with the same ``Invariant`` check and prints its one-line figure,
/// `scenario: faults injected N, rows checked M, lost 0, duplicated 0`.
///
/// Scenarios longer than about 30 s (the overload run, and the two with 100,000 users) run only with
/// `METRICSD_LONG_TESTS=1` (`scripts/test` sets it when `CI=true`): a visible gate, not a skip. Each scenario has its
/// own database or throwaway cluster.
@Suite(.serialized) struct FaultInjectionTests {
    static let long = ProcessInfo.processInfo.environment["METRICSD_LONG_TESTS"] == "1"
    static let longGate = "long fault-injection scenario: set METRICSD_LONG_TESTS=1 (scripts/test does when CI=true)"

    // MARK: 1. kill -9 mid-unit and mid-job

    /// A daemon killed (SIGKILL) in the middle of a daily unit, restarted at once: nothing happens to its chunks
    /// until their leases expire (the lease is honoured), then the new daemon resumes from the cursors within
    /// lease + one tick of the restart, and finishes with exactly one row per valid user.
    @Test(.timeLimit(.minutes(3))) func killDuringDailyUnit() async throws {
        let started = ContinuousClock.now
        try await withTestDatabase { testDatabase in
            let database = FaultDatabase(url: testDatabase.url)
            try await database.installAudit()
            try await database.execute(Fault.seedSQL(count: 6000, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)
            let lease = 4.0
            let tick = 1.0
            let extra = [
                "METRICSD_LEASE_SECONDS": "\(lease)", "METRICSD_TICK_SECONDS": "\(tick)", "METRICSD_CHUNK_SIZE": "5000",
                "METRICSD_BATCH_SIZE": "100", "METRICSD_FAULTS": "batch-delay-ms=60", "METRICSD_WORKERS": "2",
            ]
            let a = try Fault.start(testDatabase.url, dailyAt: dailyAt, extra: extra)
            // One chunk per zone, both held by A and half-way through.
            let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                let running = try await database.int(
                    "SELECT count(*) FROM work_chunks WHERE state = 'running' AND cursor_user_id > range_start")
                let rows = try await database.int("SELECT count(*) FROM profile_metrics")
                return running == 2 && rows >= 800
            }
            try #require(midway != nil, "the unit did not get under way:\n\(a.log.suffix(2000))")
            a.signal(SIGKILL)
            #expect(await a.waitForExit() != 0)
            try await Task.sleep(for: .milliseconds(200))  // a COMMIT already on the wire lands now or never
            let abandoned = try await Fault.chunkCursors(database)
            #expect(abandoned.count == 2, "both chunks unfinished when killed: \(abandoned)")
            let rowsAtKill = try await database.int("SELECT count(*) FROM profile_metrics")
            #expect(rowsAtKill < 5880, "killed mid-unit")

            let restart = ContinuousClock.now
            let b = try Fault.start(testDatabase.url, dailyAt: dailyAt, extra: extra)
            let resumed = await Fault.waitUntil(timeout: .seconds(60), poll: .milliseconds(25)) {
                try await Fault.progressed(database, since: abandoned)
            }
            let resumeDelay = try #require(
                resumed.map { ($0 - restart).faultSeconds }, "never resumed:\n\(b.log.suffix(2000))")
            print(
                "kill-9-daily: resumed \(Fault.format(resumeDelay)) s after the restart (lease \(lease) s, tick \(tick) s)"
            )
            #expect(resumeDelay <= lease + tick, "work resumed \(resumeDelay) s after the restart")
            #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")

            let done = await Fault.waitUntil(timeout: .seconds(90)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
            }
            #expect(done != nil, "units not done:\n\(b.log.suffix(2000))")
            b.signal(SIGTERM)
            #expect(await b.waitForExit() == 0)
            let report = try await Invariant.check(database, scenario: "kill-9-daily", faults: 1, dailyVersion: 1)
            report.assertHolds()
        }
        print("kill-9-daily: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// The same with a recompute-all job (formula version 2): killed mid-job, restarted, resumed from the cursors
    /// within lease + one tick, one row per valid user with the new version.
    @Test(.timeLimit(.minutes(3))) func killDuringRecomputeJob() async throws {
        let started = ContinuousClock.now
        try await withTestDatabase { testDatabase in
            let database = FaultDatabase(url: testDatabase.url)
            try await database.installAudit()
            let zones = ["Europe/Paris", "Pacific/Chatham"]
            try await database.execute(Fault.seedSQL(count: 4000, zones: zones))
            let dailyAt = try await Fault.dailyTime(database)
            try await Fault.leaveVersion2ToTheJob(database, zones: zones)
            let lease = 4.0
            let tick = 1.0
            let extra = [
                "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_LEASE_SECONDS": "\(lease)",
                "METRICSD_TICK_SECONDS": "\(tick)", "METRICSD_CHUNK_SIZE": "2000", "METRICSD_BATCH_SIZE": "100",
                "METRICSD_FAULTS": "batch-delay-ms=60", "METRICSD_WORKERS": "2",
            ]
            let trigger = try await Subprocess.run(
                try DaemonProcess.binary(), ["recompute-all"],
                environment: [
                    "DATABASE_URL": testDatabase.url, "METRICSD_TEST_FORMULA_VERSION": "2",
                    "METRICSD_CHUNK_SIZE": "2000",
                ])
            try #require(trigger.status == 0, "\(trigger.output)")
            #expect(try await database.int("SELECT count(*) FROM work_chunks WHERE kind = 'recompute'") == 2)

            let a = try Fault.start(testDatabase.url, dailyAt: dailyAt, extra: extra)
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
            try await Task.sleep(for: .milliseconds(200))
            let abandoned = try await Fault.chunkCursors(database)
            #expect(abandoned.count == 2, "both chunks unfinished when killed: \(abandoned)")
            #expect(try await database.value("SELECT state FROM recompute_jobs") == "running")

            let restart = ContinuousClock.now
            let b = try Fault.start(testDatabase.url, dailyAt: dailyAt, extra: extra)
            let resumed = await Fault.waitUntil(timeout: .seconds(60), poll: .milliseconds(25)) {
                try await Fault.progressed(database, since: abandoned)
            }
            let resumeDelay = try #require(
                resumed.map { ($0 - restart).faultSeconds }, "never resumed:\n\(b.log.suffix(2000))")
            print(
                "kill-9-recompute: resumed \(Fault.format(resumeDelay)) s after the restart (lease \(lease) s, tick \(tick) s)"
            )
            #expect(resumeDelay <= lease + tick, "work resumed \(resumeDelay) s after the restart")
            #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")

            let done = await Fault.waitUntil(timeout: .seconds(90)) {
                try await database.value("SELECT state FROM recompute_jobs") == "done"
            }
            #expect(done != nil, "job not done:\n\(b.log.suffix(2000))")
            b.signal(SIGTERM)
            #expect(await b.waitForExit() == 0)
            let report = try await Invariant.check(database, scenario: "kill-9-recompute", faults: 1)
            report.assertHolds()
        }
        print("kill-9-recompute: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: 2. PostgreSQL restarted under a running unit and HTTP load

    /// PostgreSQL stopped (fast shutdown) and started again while a unit runs and `wrk` keeps GETting
    /// `/v1/profile/metrics/today`: the daemon neither crashes nor exits, `/readyz` goes 503 then 200, HTTP answers
    /// only 200 or 503 throughout and 200 again afterwards, and the unit completes once the database is back.
    @Test(.timeLimit(.minutes(4)))
    func postgresRestartUnderLoad() async throws {
        let started = ContinuousClock.now
        try await withThrowawayCluster("fault-restart") { cluster in
            try await cluster.start()
            let database = FaultDatabase(url: cluster.url)
            try await Fault.migrate(cluster.url)
            try await database.installAudit()
            try await database.execute(Fault.seedSQL(count: 6000, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)
            let daemon = try Fault.start(
                cluster.url, dailyAt: dailyAt,
                extra: [
                    "METRICSD_CHUNK_SIZE": "5000", "METRICSD_BATCH_SIZE": "100", "METRICSD_FAULTS": "batch-delay-ms=60",
                    "METRICSD_WORKERS": "2",
                ])
            try await daemon.waitUntilReady()
            let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                try await database.int(
                    "SELECT count(*) FROM work_chunks WHERE state = 'running' AND cursor_user_id > range_start") == 2
            }
            try #require(midway != nil, "the unit did not get under way:\n\(daemon.log.suffix(2000))")

            let script = try Fault.wrkScript(users: Fault.validUserIDs(6000, count: 500))
            async let load = Fault.wrk(port: daemon.port, connections: 16, seconds: 20, script: script)
            try await Task.sleep(for: .seconds(2))

            try await cluster.stop()
            let down = ContinuousClock.now
            let unready = await Fault.waitUntil(timeout: .seconds(10)) {
                await Fault.probe(port: daemon.port, path: "/readyz").status == 503
            }
            #expect(unready != nil, "/readyz did not go 503 with the database down")
            try await Task.sleep(for: .seconds(2))
            #expect(daemon.process.isRunning, "the daemon exited with the database down:\n\(daemon.log.suffix(2000))")
            let duringOutage = await Fault.probe(
                port: daemon.port, path: "/v1/profile/metrics/today", token: TestTokens.user(1))
            #expect(
                duringOutage.status == 503, "a request during the outage: \(String(describing: duringOutage.status))")

            try await cluster.start()
            let up = ContinuousClock.now
            let ready = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(20)) {
                await Fault.probe(port: daemon.port, path: "/readyz").status == 200
            }
            let readyDelay = try #require(
                ready.map { ($0 - up).faultSeconds }, "/readyz never 200 again:\n\(daemon.log.suffix(2000))")
            print(
                "pg-restart: database down \(Fault.format((up - down).faultSeconds)) s; /readyz 200 \(Fault.format(readyDelay)) s after the database restart"
            )

            let done = await Fault.waitUntil(timeout: .seconds(150)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
            }
            let completed = try #require(
                done.map { ($0 - up).faultSeconds }, "units not done:\n\(daemon.log.suffix(3000))")
            print("pg-restart: units completed \(Fault.format(completed)) s after the database restart")
            // Not held up until the interrupted chunks' leases (60 s) expire: their owner is alive and takes them back.
            #expect(completed < 30, "the unit waited \(completed) s for the database's return to be noticed")

            let result = try await load
            print("pg-restart: wrk \(result.summary)")
            #expect(
                result.statuses.keys.allSatisfy { $0 == 200 || $0 == 503 },
                "statuses other than 200/503: \(result.statuses)")
            #expect((result.statuses[503] ?? 0) > 0, "no 503 during the outage: \(result.statuses)")
            #expect((result.statuses[200] ?? 0) > 0)
            let after = await Fault.probe(
                port: daemon.port, path: "/v1/profile/metrics/today", token: TestTokens.user(1))
            #expect(after.status == 200, "HTTP does not serve again: \(String(describing: after.status))")
            #expect(daemon.process.isRunning, "the daemon is the same process, never restarted")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
            let report = try await Invariant.check(database, scenario: "pg-restart", faults: 1, dailyVersion: 1)
            report.assertHolds()
        }
        print("pg-restart: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: 3. Connections cut mid-transaction

    /// `pg_terminate_backend` on every backend of the daemon, several times while a unit runs and HTTP requests
    /// arrive: no crash, only 200 or 503, the unit completes, one row per valid user.
    @Test(.timeLimit(.minutes(3))) func connectionsTerminatedMidTransaction() async throws {
        let started = ContinuousClock.now
        try await withTestDatabase { testDatabase in
            let database = FaultDatabase(url: testDatabase.url)
            try await database.installAudit()
            try await database.execute(Fault.seedSQL(count: 6000, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)
            let daemon = try Fault.start(
                testDatabase.url, dailyAt: dailyAt,
                extra: [
                    "METRICSD_CHUNK_SIZE": "5000", "METRICSD_BATCH_SIZE": "100", "METRICSD_FAULTS": "batch-delay-ms=80",
                    "METRICSD_WORKERS": "2",
                ])
            try await daemon.waitUntilReady()
            let underway = await Fault.waitUntil(timeout: .seconds(60)) {
                try await database.int(
                    "SELECT count(*) FROM work_chunks WHERE state = 'running' AND cursor_user_id > range_start") == 2
            }
            try #require(underway != nil, "the unit did not get under way:\n\(daemon.log.suffix(2000))")
            let script = try Fault.wrkScript(users: Fault.validUserIDs(6000, count: 500))
            async let load = Fault.wrk(port: daemon.port, connections: 8, seconds: 12, script: script)

            var terminated = 0
            var rounds = 0
            var last = try await Fault.chunkCursors(database)
            while rounds < 3 {
                // Only while a batch is in flight: some chunk has advanced since the last cut.
                let advanced = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(20)) {
                    try await Fault.progressed(database, since: last)
                }
                guard advanced != nil else { break }
                try await Task.sleep(for: .milliseconds(40))  // into the next batch's transaction
                terminated += try await database.int(
                    """
                    SELECT count(*) FROM (
                      SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE application_name = 'metricsd' AND datname = current_database()) t
                    """)
                rounds += 1
                last = try await Fault.chunkCursors(database)
                try await Task.sleep(for: .milliseconds(500))
                #expect(daemon.process.isRunning, "the daemon exited after a cut:\n\(daemon.log.suffix(2000))")
            }
            print("pg-terminate: \(rounds) rounds, \(terminated) backends terminated")
            #expect(rounds == 3, "the unit finished before the cuts: \(rounds) rounds")
            let lastCut = ContinuousClock.now

            let done = await Fault.waitUntil(timeout: .seconds(120)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
            }
            let completed = try #require(
                done.map { ($0 - lastCut).faultSeconds }, "units not done:\n\(daemon.log.suffix(3000))")
            print("pg-terminate: units completed \(Fault.format(completed)) s after the last cut")
            // The failed chunks come back after their failure backoff (2, 4, 8 s), not after their 60 s lease.
            #expect(completed < 45, "a cut chunk waited for its lease to expire")
            let result = try await load
            print("pg-terminate: wrk \(result.summary)")
            // The database never went away: a request that met a cut connection is retried on a new one.
            #expect(
                result.statuses.keys.allSatisfy { $0 == 200 },
                "requests failed with the database up: \(result.statuses)")
            #expect(await Fault.probe(port: daemon.port, path: "/readyz").status == 200)
            #expect(
                await Fault.probe(port: daemon.port, path: "/v1/profile/metrics/today", token: TestTokens.user(1))
                    .status == 200)
            #expect(daemon.log.contains("Worker failed; retrying"), "the cuts hit no batch")
            #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
            let report = try await Invariant.check(
                database, scenario: "pg-terminate", faults: terminated, dailyVersion: 1)
            report.assertHolds()
        }
        print("pg-terminate: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: 4. Three instances racing on an empty schema, 100,000 users due at once

    /// A database with only the contract tables (migration 0001, recorded as metricsd's migrator records it) and
    /// 100,000 users whose daily time has passed: three `metricsd serve --migrate` started together race to apply
    /// every migration after 0001 (each applied once), then share the 100,000 users: every chunk written by exactly one instance
    /// (the `fault_audit` writer of its rows is its lease owner) and claimed once, all three do work.
    @Test(
        .enabled(if: FaultInjectionTests.long, Comment(rawValue: FaultInjectionTests.longGate)), .timeLimit(.minutes(6))
    )
    func threeInstancesRaceOnEmptySchema() async throws {
        let started = ContinuousClock.now
        try await withEmptyDatabase { url in
            let database = FaultDatabase(url: url)
            try await database.withConnection { connection in
                _ = try Migrator(migrations: [Migration.all[0]]).migrate(on: connection, logger: Logger(label: "test"))
            }
            try await database.installAudit()
            let zones = try await Fault.zones(50)
            try await database.execute(Fault.seedSQL(count: 100_000, zones: zones))
            let dailyAt = try await Fault.dailyTime(database)
            let seeded = ContinuousClock.now
            print("three-instances: seeded 100000 users in \(Fault.format((seeded - started).faultSeconds)) s")

            let extra = ["METRICSD_CHUNK_SIZE": "500", "METRICSD_BATCH_SIZE": "250", "METRICSD_WORKERS": "2"]
            let daemons = try (1...3).map { index in
                try Fault.start(
                    url, dailyAt: dailyAt, name: "metricsd-\(index)", extra: extra, arguments: ["serve", "--migrate"])
            }
            for daemon in daemons { try await daemon.waitUntilReady(timeout: .seconds(120)) }
            let migrations = try await database.rows("SELECT name FROM metricsd_migrations ORDER BY name").map {
                $0[0] ?? ""
            }
            #expect(migrations == Migration.all.map(\.name))
            let applied = daemons.map { $0.log.components(separatedBy: "Applying migration").count - 1 }
            #expect(
                applied.reduce(0, +) == Migration.all.count - 1, "each migration after 0001 applied once: \(applied)")

            let done = await Fault.waitUntil(timeout: .seconds(300), poll: .milliseconds(500)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == zones.count
            }
            let elapsed = try #require(
                done.map { ($0 - seeded).faultSeconds }, "units not done:\n\(daemons[0].log.suffix(3000))")
            print("three-instances: 100000 users done \(Fault.format(elapsed)) s after the start")

            let chunks = try await database.int("SELECT count(*) FROM work_chunks")
            let attempts = try await database.int("SELECT sum(attempts) FROM work_chunks")
            #expect(attempts == chunks, "a chunk was claimed more than once: \(attempts) claims for \(chunks) chunks")
            // Each chunk's rows were written by one instance, its lease owner.
            let pids = Dictionary(
                uniqueKeysWithValues: daemons.enumerated().map { (String($1.pid), "metricsd-\($0 + 1)") })
            let writers = try await database.rows(
                """
                SELECT c.id, split_part(c.lease_owner, ':', 2), count(DISTINCT a.app), min(a.app)
                FROM work_chunks c
                JOIN users u ON u.timezone = c.timezone AND u.id > c.range_start AND u.id <= c.range_end
                JOIN fault_audit a ON a.user_id = u.id AND a.metrics_date = c.local_date AND a.version = c.version
                GROUP BY c.id, c.lease_owner
                """)
            let shared = writers.filter { $0[2] != "1" }
            let foreign = writers.filter { $0[2] == "1" && pids[$0[1] ?? ""] != $0[3] }
            #expect(shared.isEmpty, "chunks written by two instances: \(shared.prefix(5))")
            #expect(
                foreign.isEmpty, "chunks written by an instance that was not their lease owner: \(foreign.prefix(5))")
            let owners = try await database.rows(
                "SELECT split_part(lease_owner, ':', 2), count(*) FROM work_chunks WHERE state = 'done' GROUP BY 1")
            print(
                "three-instances: \(chunks) chunks; done per instance: \(owners.map { "\(pids[$0[0] ?? ""] ?? "?")=\($0[1] ?? "")" }.joined(separator: " "))"
            )
            #expect(Set(owners.compactMap { $0[0] }) == Set(pids.keys), "all three instances did work: \(owners)")
            for daemon in daemons {
                #expect(!daemon.log.contains("lease lost"), "\(daemon.log.suffix(2000))")
                daemon.signal(SIGTERM)
            }
            for daemon in daemons { #expect(await daemon.waitForExit() == 0) }
            let report = try await Invariant.check(database, scenario: "three-instances", faults: 3, dailyVersion: 1)
            report.assertHolds()
        }
        print("three-instances: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: 5. SIGTERM mid-chunk

    /// SIGTERM while a daemon is in the middle of a chunk: it exits 0 within `METRICSD_SHUTDOWN_SECONDS`, its
    /// last batch is whole (its rows are exactly the users up to its final cursor, a whole number of batches), the
    /// lease is given back at once (a peer claims the chunk long before the 30 s lease would expire) and the peer
    /// finishes.
    @Test(.timeLimit(.minutes(3))) func sigtermMidChunk() async throws {
        let started = ContinuousClock.now
        try await withTestDatabase { testDatabase in
            let database = FaultDatabase(url: testDatabase.url)
            try await database.installAudit()
            try await database.execute(Fault.seedSQL(count: 3000, zones: ["America/Santiago"]))
            let dailyAt = try await Fault.dailyTime(database)
            let batch = 100
            let shutdownSeconds = 5.0
            let extra = [
                "METRICSD_LEASE_SECONDS": "30", "METRICSD_CHUNK_SIZE": "5000", "METRICSD_BATCH_SIZE": "\(batch)",
                "METRICSD_FAULTS": "batch-delay-ms=150", "METRICSD_WORKERS": "1",
                "METRICSD_SHUTDOWN_SECONDS": "\(shutdownSeconds)",
            ]
            let a = try Fault.start(testDatabase.url, dailyAt: dailyAt, name: "metricsd-a", extra: extra)
            let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                try await database.int("SELECT count(*) FROM profile_metrics") >= 500
            }
            try #require(midway != nil, "the unit did not get under way:\n\(a.log.suffix(2000))")
            let b = try Fault.start(testDatabase.url, dailyAt: dailyAt, name: "metricsd-b", extra: extra)
            try await b.waitUntilReady()
            #expect(
                try await database.int(
                    "SELECT count(*) FROM work_chunks WHERE split_part(lease_owner, ':', 2) = $1", [String(b.pid)])
                    == 0,
                "the peer has nothing to claim while A holds the only chunk")

            a.signal(SIGTERM)
            let signalled = ContinuousClock.now
            let status = await a.waitForExit(timeout: .seconds(shutdownSeconds + 5))
            let exitSeconds = (ContinuousClock.now - signalled).faultSeconds
            print("sigterm: exited \(String(describing: status)) \(Fault.format(exitSeconds)) s after SIGTERM")
            #expect(status == 0, "\(a.log.suffix(2000))")
            #expect(exitSeconds <= shutdownSeconds, "exit took \(exitSeconds) s")
            #expect(a.log.contains("Chunk handed back on shutdown"), "\(a.log.suffix(2000))")

            // The lease came back at once: the peer's claim follows A's release within a second or two.
            let takeover = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(20)) {
                try await database.int(
                    "SELECT count(*) FROM fault_chunk_log WHERE split_part(new_owner, ':', 2) = $1 AND old_owner IS DISTINCT FROM new_owner",
                    [String(b.pid)]) > 0
            }
            let takeoverSeconds = try #require(
                takeover.map { ($0 - signalled).faultSeconds }, "the peer never took over:\n\(b.log.suffix(2000))")
            print("sigterm: peer took over \(Fault.format(takeoverSeconds)) s after SIGTERM (lease 30 s)")
            #expect(takeoverSeconds < 10, "the lease was not released at once")
            let handover = try #require(
                try await database.rows(
                    """
                    SELECT l.new_cursor, c.range_start, extract(epoch FROM c2.old_lease_until - c2.statement_now)
                    FROM fault_chunk_log l JOIN work_chunks c ON c.id = l.chunk_id
                    JOIN fault_chunk_log c2 ON c2.chunk_id = l.chunk_id AND split_part(c2.new_owner, ':', 2) = $2
                                           AND c2.old_owner IS DISTINCT FROM c2.new_owner
                    WHERE split_part(l.old_owner, ':', 2) = $1 AND l.new_lease_until < l.statement_now
                    """, [String(a.pid), String(b.pid)]
                ).first,
                "no release by A followed by a claim by B in the chunk log")
            let finalCursor = handover[0] ?? ""
            #expect(Double(handover[2] ?? "") ?? 1 < 0, "the peer claimed under a released lease, not a live one")
            // A's batches are whole: its rows are exactly the valid users up to its final cursor.
            let byA = try await database.int("SELECT count(*) FROM fault_audit WHERE app = 'metricsd-a'")
            let beyond = try await database.int(
                "SELECT count(*) FROM fault_audit WHERE app = 'metricsd-a' AND user_id > $1", [finalCursor])
            let upToCursor = try await database.int("SELECT count(*) FROM users WHERE id <= $1", [finalCursor])
            let validUpToCursor = try await database.int(
                "SELECT count(*) FROM users u JOIN user_settings s ON s.user_id = u.id WHERE u.id <= $1 AND s.height >= 100",
                [finalCursor])
            print(
                "sigterm: A stopped at user \(finalCursor) after \(upToCursor) users (\(upToCursor / batch) batches of \(batch)); wrote \(byA) rows"
            )
            #expect(beyond == 0, "A wrote rows beyond its final cursor")
            #expect(upToCursor % batch == 0, "A's last batch was partial: \(upToCursor) users up to the cursor")
            #expect(byA == validUpToCursor, "A's rows are not exactly its whole batches")

            let done = await Fault.waitUntil(timeout: .seconds(90)) {
                try await database.value("SELECT state FROM daily_units") == "done"
            }
            #expect(done != nil, "the peer did not finish:\n\(b.log.suffix(2000))")
            b.signal(SIGTERM)
            #expect(await b.waitForExit() == 0)
            #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")
            let report = try await Invariant.check(database, scenario: "sigterm-mid-chunk", faults: 1, dailyVersion: 1)
            report.assertHolds()
        }
        print("sigterm-mid-chunk: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: 6. Overload

    /// `wrk` at many times the measured capacity for 30 s (512 connections where 32 already saturate it): the daemon
    /// stays up with a bounded peak RSS, answers 200 or a 503 that the in-flight limit (`METRICSD_MAX_IN_FLIGHT`)
    /// decides at once (under 100 ms in the daemon, by its own histogram), leaves at most 2% unanswered within
    /// wrk's 10 s (2 CPUs shared with wrk, PostgreSQL and the other tests), and serves normally right after.
    @Test(
        .enabled(if: FaultInjectionTests.long, Comment(rawValue: FaultInjectionTests.longGate)), .timeLimit(.minutes(4))
    )
    func overload() async throws {
        let started = ContinuousClock.now
        try await withTestDatabase { testDatabase in
            let database = FaultDatabase(url: testDatabase.url)
            try await database.installAudit()
            try await database.execute(
                Fault.seedSQL(count: 2000, zones: ["Europe/Berlin", "Asia/Tokyo", "America/New_York"]))
            let dailyAt = try await Fault.dailyTime(database)
            let daemon = try Fault.start(testDatabase.url, dailyAt: dailyAt)
            try await daemon.waitUntilReady()
            let done = await Fault.waitUntil(timeout: .seconds(60)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 3
            }
            try #require(done != nil, "units not done:\n\(daemon.log.suffix(2000))")
            let script = try Fault.wrkScript(users: Fault.validUserIDs(2000, count: 1000))

            let capacity = try await Fault.wrk(port: daemon.port, connections: 32, seconds: 5, script: script)
            print("overload: capacity at 32 connections: \(capacity.summary)")
            #expect(capacity.statuses.keys.allSatisfy { $0 == 200 }, "\(capacity.statuses)")
            // 16 times the concurrency that already saturates it (8 times the default in-flight limit, 64), for 30 s.
            let connections = 512
            let probes = ProbeLog()
            let load = Task {
                try await Fault.wrk(port: daemon.port, connections: connections, seconds: 30, script: script)
            }
            let prober = Task {
                try? await Task.sleep(for: .seconds(2))
                while !Task.isCancelled {
                    let result = await Fault.probe(
                        port: daemon.port, path: "/v1/profile/metrics/today", token: TestTokens.user(1))
                    probes.append(result)
                    try? await Task.sleep(for: .milliseconds(500))
                }
            }
            let overload = try await load.value
            prober.cancel()
            _ = await prober.value
            let peakKB = Fault.peakRSSKilobytes(pid: daemon.pid) ?? -1
            let probed = probes.all
            let probeSummary =
                "probes: \(probed.count), 200: \(probed.filter { $0.status == 200 }.count), 503: \(probed.filter { $0.status == 503 }.count), no answer: \(probed.filter { $0.status == nil }.count), slowest \(Fault.format(probed.map(\.seconds).max() ?? 0)) s"
            // How long the daemon took over the requests it shed (from its own histogram, first middleware to response).
            // Right after the load, requests that wrk gave up on may still hold the in-flight slots, and /metrics
            // itself is shed (503): asked again until it answers.
            var metrics = ""
            for _ in 0..<30 {
                let response = try await daemon.request("/metrics")
                if response.status == .ok {
                    metrics = response.text
                    break
                }
                try await Task.sleep(for: .milliseconds(500))
            }
            let shed = Fault.metric(metrics, "metricsd_http_request_duration_seconds_count{route=\"shed\"}")
            let shedFast = Fault.metric(
                metrics, "metricsd_http_request_duration_seconds_bucket{route=\"shed\",le=\"0.1\"}")
            let unanswered = overload.errors.timeout + overload.errors.connect + overload.errors.read
            print("overload: \(connections) connections for 30 s: \(overload.summary)")
            print(
                "overload: shed with 503 by the in-flight limit: \(shed), of them within 100 ms: \(shedFast); \(probeSummary)"
            )
            print("overload: peak RSS (VmHWM) \(peakKB / 1024) MB")
            #expect(daemon.process.isRunning, "the daemon died under overload:\n\(daemon.log.suffix(2000))")
            #expect(peakKB > 0 && peakKB < 300 * 1024, "peak RSS \(peakKB) kB")
            #expect(
                overload.statuses.keys.allSatisfy { $0 == 200 || $0 == 503 },
                "statuses other than 200/503: \(overload.statuses)")
            #expect((overload.statuses[503] ?? 0) > 0 && shed > 0, "no request was shed: \(overload.summary)")
            #expect(
                shedFast == shed, "a shed request took over 100 ms in the daemon: \(shedFast) of \(shed) within 100 ms")
            // Whatever is neither a 200 nor a 503 (no answer within wrk's 10 s): at most 2%. The tail is CPU
            // scheduling (a debug build on 2 CPUs shared with wrk, PostgreSQL and the other tests), not a queue.
            #expect(unanswered * 50 <= overload.requests, "\(unanswered) requests unanswered: \(overload.summary)")
            #expect(probed.allSatisfy { $0.status == 200 || $0.status == 503 || $0.status == nil }, "\(probeSummary)")

            // Right after: a normal request within 1 s, and ready.
            let after = await Fault.probe(
                port: daemon.port, path: "/v1/profile/metrics/today", token: TestTokens.user(1))
            print(
                "overload: first request after: \(String(describing: after.status)) in \(Fault.format(after.seconds)) s"
            )
            #expect(after.status == 200 && after.seconds < 1, "after the overload: \(after)")
            #expect(await Fault.probe(port: daemon.port, path: "/readyz").status == 200)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
            let report = try await Invariant.check(
                database, scenario: "overload", faults: overload.requests, dailyVersion: 1)
            report.assertHolds()
        }
        print("overload: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: 7. Bad data at scale

    /// 100,000 users, 5% of them with each kind of bad settings and 5% in time zones PostgreSQL does not know:
    /// the daily run completes, every bad user is in `metrics_skips` with the pure core's reasons (and
    /// `metricsd skipped` lists them), no row for any of them, the right row for every valid user.
    @Test(
        .enabled(if: FaultInjectionTests.long, Comment(rawValue: FaultInjectionTests.longGate)), .timeLimit(.minutes(6))
    )
    func badDataAtScale() async throws {
        let started = ContinuousClock.now
        try await withTestDatabase { testDatabase in
            let database = FaultDatabase(url: testDatabase.url)
            try await database.installAudit()
            let zones = try await Fault.zones(40)
            try await database.execute(Fault.badDataSQL(count: 100_000, zones: zones))
            let dailyAt = try await Fault.dailyTime(database)
            let bad = try await database.int(
                "SELECT count(*) FROM users u LEFT JOIN user_settings s ON s.user_id = u.id WHERE u.id % 20 < 10")
            let seeded = ContinuousClock.now
            print("bad-data: seeded 100000 users (\(bad) bad) in \(Fault.format((seeded - started).faultSeconds)) s")

            let daemon = try Fault.start(
                testDatabase.url, dailyAt: dailyAt,
                extra: ["METRICSD_CHUNK_SIZE": "5000", "METRICSD_BATCH_SIZE": "1000", "METRICSD_WORKERS": "2"])
            let unitCount = try await database.int("SELECT count(DISTINCT timezone) FROM users")
            let done = await Fault.waitUntil(timeout: .seconds(300), poll: .milliseconds(500)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == unitCount
            }
            let elapsed = try #require(
                done.map { ($0 - seeded).faultSeconds }, "units not done:\n\(daemon.log.suffix(3000))")
            print("bad-data: \(unitCount) units done \(Fault.format(elapsed)) s after the start")
            #expect(daemon.log.components(separatedBy: "Daily unit done").count - 1 == unitCount)

            let report = try await Invariant.check(database, scenario: "bad-data", faults: bad, dailyVersion: 1)
            report.assertHolds()
            #expect(
                report.skippedUsers == bad, "every bad user is skipped, no valid one: \(report.skippedUsers) of \(bad)")
            let byCode = try await database.rows(
                "SELECT code, count(*) FROM metrics_skips, unnest(reason_codes) code GROUP BY code ORDER BY code")
            print("bad-data: skips by reason: \(byCode.map { "\($0[0] ?? "")=\($0[1] ?? "")" }.joined(separator: " "))")
            #expect(
                Set(byCode.compactMap { $0[0] }) == Set(SkipReason.Code.allCases.map(\.rawValue)),
                "every kind of reason: \(byCode)")

            // `metricsd skipped` lists every one of them with the core's reasons (all of them, as JSON), and the
            // table shows the reason sentence.
            let listed = try await Subprocess.capture(
                try DaemonProcess.binary(), ["skipped", "--limit", "1000000", "--json"],
                environment: ["DATABASE_URL": testDatabase.url])
            #expect(listed.status == 0, "\(listed.stderr)")
            let entries = try #require(
                try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]],
                "\(listed.stdout.prefix(500))")
            #expect(entries.count == bad, "metricsd skipped lists \(entries.count) users, \(bad) are bad")
            var misreported = 0
            for entry in entries {
                let id = Int64(entry["userId"] as? Int ?? -1)
                guard let expected = report.expectedSkips[id],
                    entry["reasons"] as? String == expected.map(\.description).joined(separator: "; "),
                    entry["reasonCodes"] as? [String] == expected.map(\.code.rawValue)
                else {
                    misreported += 1
                    if misreported <= 3 {
                        Issue.record(
                            "user \(id) listed as \(entry), the core says \(String(describing: report.expectedSkips[id]))"
                        )
                    }
                    continue
                }
            }
            #expect(misreported == 0)
            print(
                "bad-data: metricsd skipped --json lists \(entries.count) users, \(misreported) not with the core's reasons"
            )
            let table = try await Subprocess.capture(
                try DaemonProcess.binary(), ["skipped", "--limit", "5"], environment: ["DATABASE_URL": testDatabase.url]
            )
            #expect(table.status == 0)
            if let first = entries.first, let reasons = first["reasons"] as? String {
                #expect(table.stdout.contains("USER") && table.stdout.contains(reasons), "\(table.stdout)")
            }
            print("bad-data: metricsd skipped --limit 5:\n\(table.stdout)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
        print("bad-data: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: 8. Database out of connections

    /// Another client holds every `max_connections` slot: a starting daemon waits (one clear log line with the
    /// server's "too many clients"), a running one whose connections were cut retries; neither crashes, both
    /// recover when the slots are freed, and the unit completes.
    @Test(.timeLimit(.minutes(4)))
    func outOfConnections() async throws {
        let started = ContinuousClock.now
        try await withThrowawayCluster("fault-maxconn") { cluster in
            try await cluster.start()
            let database = FaultDatabase(url: cluster.url)
            try await database.execute("ALTER SYSTEM SET max_connections = 20")
            try await cluster.stop()
            try await cluster.start()
            #expect(try await database.value("SHOW max_connections") == "20")
            try await Fault.migrate(cluster.url)
            try await database.installAudit()
            try await database.execute(Fault.seedSQL(count: 6000, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)

            // Start-up with every slot taken.
            let hog = ConnectionHog(url: cluster.url)
            let first = await hog.fill()
            print(
                "out-of-connections: the hog holds \(first.opened) connections; refused with: \(first.refusal ?? "-")")
            #expect(first.refusal?.contains("too many clients") == true, "\(String(describing: first.refusal))")
            let daemon = try Fault.start(
                cluster.url, dailyAt: dailyAt,
                extra: [
                    "METRICSD_CHUNK_SIZE": "5000", "METRICSD_BATCH_SIZE": "100", "METRICSD_FAULTS": "batch-delay-ms=60",
                    "METRICSD_WORKERS": "2", "METRICSD_LEASE_SECONDS": "10",
                ])
            let waiting = await Fault.waitUntil(timeout: .seconds(20)) {
                daemon.log.contains("Waiting for database") && daemon.log.contains("too many clients")
            }
            #expect(waiting != nil, "no clear log line:\n\(daemon.log.suffix(2000))")
            try await Task.sleep(for: .seconds(2))
            #expect(daemon.process.isRunning, "the daemon exited:\n\(daemon.log.suffix(2000))")
            print(
                "out-of-connections: start-up log line: \(daemon.log.split(separator: "\n").first { $0.contains("too many clients") } ?? "")"
            )
            await hog.release()
            let freed = ContinuousClock.now
            try await daemon.waitUntilReady()
            print(
                "out-of-connections: ready \(Fault.format((ContinuousClock.now - freed).faultSeconds)) s after the slots were freed"
            )

            // Running, mid-unit: every slot taken and the daemon's connections cut.
            let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                try await database.int("SELECT count(*) FROM profile_metrics") >= 600
            }
            try #require(midway != nil, "the unit did not get under way:\n\(daemon.log.suffix(2000))")
            let mark = daemon.log.count
            let second = await hog.fill()
            let cut = try await hog.query(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'metricsd') t"
            )
            let refill = await hog.fill(for: .seconds(2))
            print(
                "out-of-connections: hog +\(second.opened) connections, cut \(cut ?? "?") daemon backends, took \(refill.opened) of the freed slots"
            )
            let starved = await Fault.waitUntil(timeout: .seconds(15)) {
                String(daemon.log.dropFirst(mark)).contains("too many clients")
            }
            #expect(starved != nil, "no log line about the full server while running:\n\(daemon.log.suffix(2000))")
            let whileFull = await Fault.probe(port: daemon.port, path: "/readyz")
            print(
                "out-of-connections: /readyz while the server is full: \(String(describing: whileFull.status)) (200 when the daemon kept or won a slot)"
            )
            try await Task.sleep(for: .seconds(3))
            #expect(daemon.process.isRunning, "the daemon exited:\n\(daemon.log.suffix(2000))")
            await hog.release()
            let freedAgain = ContinuousClock.now
            let readyAgain = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(20)) {
                await Fault.probe(port: daemon.port, path: "/readyz").status == 200
            }
            #expect(readyAgain != nil)
            print(
                "out-of-connections: /readyz 200 \(Fault.format(((readyAgain ?? freedAgain) - freedAgain).faultSeconds)) s after the slots were freed"
            )
            let done = await Fault.waitUntil(timeout: .seconds(120)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
            }
            #expect(done != nil, "units not done:\n\(daemon.log.suffix(3000))")
            print(
                "out-of-connections: units done \(Fault.format(((done ?? freedAgain) - freedAgain).faultSeconds)) s after the slots were freed"
            )
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
            let report = try await Invariant.check(database, scenario: "out-of-connections", faults: 2, dailyVersion: 1)
            report.assertHolds()
        }
        print("out-of-connections: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }
}

// MARK: - Tools

/// What the scenarios share: seeding, starting daemons, waiting, probing, load.
enum Fault {
    /// SQL for `count` users (ids 1…count, round-robin over `zones`) with valid settings, except every
    /// `invalidEvery`-th user whose height is 72 cm. Settings changed a day ago and triggers off while seeding,
    /// so the settings sweep leaves them to the daily run (as for users who onboarded earlier).
    static func seedSQL(count: Int, zones: [String], invalidEvery: Int? = 50) -> String {
        let height =
            invalidEvery.map { "CASE WHEN id % \($0) = 0 THEN 72 ELSE 150 + (id % 60) + (id % 2) * 0.5 END" }
            ?? "150 + (id % 60) + (id % 2) * 0.5"
        return """
            SET session_replication_role = replica;
            INSERT INTO users (id, timezone)
            SELECT g, (\(Self.array(zones)))[1 + g % \(zones.count)] FROM generate_series(1, \(count)) g;
            INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level,
                                       onboarding_completed, updated_at)
            SELECT id, date '1950-01-01' + (id * 37 % 18000)::int, (ARRAY['male','female','other'])[1 + id % 3],
                   45 + (id % 80) + (id % 4) * 0.25, \(height),
                   (ARRAY['sedentary','lightly_active','moderately_active','very_active','extremely_active'])[1 + id % 5],
                   true, now() - interval '1 day'
            FROM users;
            SET session_replication_role = DEFAULT;
            SELECT setval(pg_get_serial_sequence('users', 'id'), (SELECT max(id) FROM users));
            ANALYZE users;
            ANALYZE user_settings;
            """
    }

    /// SQL for `count` users where `id % 20` picks the kind of bad data (5% each): 0 height out of range, 1 weight
    /// out of range, 2 age out of range (seven years old today, or born in 1890), 3 a missing field, 4 unknown
    /// gender, 5 unknown activity level, 6 onboarding not completed, 7 no settings row, 8 malformed values (NaN, an
    /// infinite date), 9 a time zone PostgreSQL does not know; 10–19 valid.
    static func badDataSQL(count: Int, zones: [String]) -> String {
        let unknownZones = ["Mars/Olympus_Mons", "PST", "UTC+3", "Europe/Atlantis"]
        return """
            SET session_replication_role = replica;
            INSERT INTO users (id, timezone)
            SELECT g, CASE WHEN g % 20 = 9 THEN (\(Self.array(unknownZones)))[1 + (g / 20) % \(unknownZones.count)]
                           ELSE (\(Self.array(zones)))[1 + g % \(zones.count)] END
            FROM generate_series(1, \(count)) g;
            INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level,
                                       onboarding_completed, updated_at)
            SELECT id,
                   CASE WHEN k = 2 THEN (ARRAY[(current_date - interval '7 years')::date, date '1890-02-03'])[1 + v % 2]
                        WHEN k = 3 AND v % 5 = 0 THEN NULL
                        WHEN k = 8 AND v % 4 = 2 THEN 'infinity'::date
                        WHEN k = 8 AND v % 4 = 3 THEN '-infinity'::date
                        ELSE date '1950-01-01' + (id * 37 % 18000)::int END,
                   CASE WHEN k = 3 AND v % 5 = 1 THEN NULL
                        WHEN k = 4 THEN (ARRAY['M', 'unknown', 'Female', ''])[1 + v % 4]
                        ELSE (ARRAY['male','female','other'])[1 + id % 3] END,
                   CASE WHEN k = 1 THEN (ARRAY[25.5, 350, 0, -70])[1 + v % 4]
                        WHEN k = 3 AND v % 5 = 2 THEN NULL
                        WHEN k = 8 AND v % 4 = 0 THEN 'NaN'::numeric
                        ELSE 45 + (id % 80) + (id % 4) * 0.25 END,
                   CASE WHEN k = 0 THEN (ARRAY[72, 260.5, 99.9, 0])[1 + v % 4]
                        WHEN k = 3 AND v % 5 = 3 THEN NULL
                        WHEN k = 8 AND v % 4 = 1 THEN 'NaN'::numeric
                        ELSE 150 + (id % 60) + (id % 2) * 0.5 END,
                   CASE WHEN k = 3 AND v % 5 = 4 THEN NULL
                        WHEN k = 5 THEN (ARRAY['couch_potato', 'Sedentary', 'very active'])[1 + v % 3]
                        ELSE (ARRAY['sedentary','lightly_active','moderately_active','very_active','extremely_active'])[1 + id % 5] END,
                   k <> 6, now() - interval '1 day'
            FROM (SELECT id, id % 20 AS k, id / 20 AS v FROM users) u
            WHERE k <> 7;
            SET session_replication_role = DEFAULT;
            SELECT setval(pg_get_serial_sequence('users', 'id'), (SELECT max(id) FROM users));
            ANALYZE users;
            ANALYZE user_settings;
            """
    }

    static func array(_ values: [String]) -> String {
        "ARRAY[" + values.map { "'" + $0.replacingOccurrences(of: "'", with: "''") + "'" }.joined(separator: ",")
            + "]::text[]"
    }

    /// `count` IANA zones spread over PostgreSQL's list (different offsets, DST rules and hemispheres).
    static func zones(_ count: Int) async throws -> [String] {
        let all = try await FaultDatabase(url: try TestDatabase.serverURL()).rows(
            """
            SELECT name FROM pg_timezone_names
            WHERE name LIKE '%/%' AND name NOT LIKE 'posix/%' AND name NOT LIKE 'right/%' AND name NOT LIKE 'Etc/%'
            ORDER BY name
            """
        ).compactMap { $0[0] }
        let step = max(1, all.count / count)
        return Array(stride(from: 0, to: all.count, by: step).map { all[$0] }.prefix(count))
    }

    /// The first `count` ids of valid users of `seedSQL(count: users, …)` (every 50th is invalid): for tokens.
    /// Version 2's daily units of `zones` count as done already, so that only a recompute job computes version 2: a
    /// unit dated far ahead suppresses today's; it has no chunks, so the invariant expects nothing from it.
    static func leaveVersion2ToTheJob(_ database: FaultDatabase, zones: [String]) async throws {
        try await database.execute(
            """
            INSERT INTO daily_units (timezone, local_date, version, timezone_known, state, users_total, created_at)
            SELECT z, date '2999-12-31', 2, true, 'done', 0, now() FROM unnest(ARRAY['\(zones.joined(separator: "','"))']) z
            """)
    }

    static func validUserIDs(_ users: Int, count: Int) -> [Int64] {
        Array((1...Int64(users)).filter { $0 % 50 != 0 }.prefix(count))
    }

    /// `metricsd migrate` against `url`.
    static func migrate(_ url: String) async throws {
        let migrated = try await Subprocess.run(
            try DaemonProcess.binary(), ["migrate"], environment: ["DATABASE_URL": url])
        try #require(migrated.status == 0, "\(migrated.output)")
    }

    /// Starts `metricsd` (default `serve`) on a free port against `url`, its connections named `name` when given,
    /// with the scenario's daily time `dailyAt` (``dailyTime(_:)``).
    static func start(
        _ url: String, dailyAt: String, name: String? = nil, extra: [String: String] = [:],
        arguments: [String] = ["serve"]
    ) throws -> DaemonProcess {
        let port = DaemonProcess.freePort()
        let databaseURL = name.map { FaultDatabase.url(url, applicationName: $0) } ?? url
        var environment = DaemonProcess.environment(
            databaseURL: databaseURL, port: port, extra: ["METRICSD_DAILY_AT": dailyAt])
        environment.merge(extra) { $1 }
        return try DaemonProcess(arguments: arguments, environment: environment, port: port)
    }

    /// A scenario's daily time (`METRICSD_DAILY_AT`): of the 96 quarter hours, the one the users' time zones reach
    /// last from now, by the database's clock and time zone rules (zones PostgreSQL does not know follow UTC, as in
    /// the daemon). Every zone then has a unit due as soon as the daemons start (for its latest date whose daily
    /// time has passed) and none falls due while the scenario runs: with a fixed daily time, a zone that reached it
    /// mid-scenario got a second unit (the first superseded if unfinished) that the scenario neither waited for nor
    /// expected. Computed once per scenario, after seeding: all its daemons, restarted ones too, need the same one.
    static func dailyTime(_ database: FaultDatabase) async throws -> String {
        let best = try await database.rows(
            """
            WITH zones AS (
              SELECT CASE WHEN k.name IS NULL THEN 'UTC' ELSE u.timezone END AS zone
              FROM (SELECT DISTINCT timezone FROM users) u
              LEFT JOIN (SELECT DISTINCT name FROM pg_timezone_names) k ON k.name = u.timezone
            ),
            local AS (SELECT DISTINCT zone, now() AT TIME ZONE zone AS now FROM zones),
            reached AS (
              SELECT t.at,
                     min(((l.now::date + t.at + CASE WHEN t.at <= l.now::time THEN interval '1 day' ELSE interval '0' END)
                          AT TIME ZONE l.zone) - now()) AS after
              FROM (SELECT make_time(q / 4, q % 4 * 15, 0) AS at FROM generate_series(0, 95) q) t CROSS JOIN local l
              GROUP BY t.at
            )
            SELECT to_char(at, 'HH24:MI'), extract(epoch FROM after)::int FROM reached ORDER BY after DESC, at LIMIT 1
            """)
        let time = try #require(best.first?[0] ?? nil, "no users to schedule")
        let seconds = Int(best.first?[1] ?? "") ?? 0
        // (The scenarios take minutes; the zones of any of them leave a daily time free for hours.)
        try #require(
            seconds >= 3600, "the users' zones reach every daily time within the hour (\(time) in \(seconds) s)")
        return time
    }

    /// Polls `condition` until it holds; the instant it did, or nil on timeout. Errors count as "not yet".
    static func waitUntil(
        timeout: Duration, poll: Duration = .milliseconds(100), _ condition: () async throws -> Bool
    ) async -> ContinuousClock.Instant? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if (try? await condition()) == true { return ContinuousClock.now }
            try? await Task.sleep(for: poll)
        }
        return (try? await condition()) == true ? ContinuousClock.now : nil
    }

    /// The cursors of the chunks not done yet.
    static func chunkCursors(_ database: FaultDatabase) async throws -> [(id: String, cursor: String)] {
        try await database.rows(
            "SELECT id, cursor_user_id FROM work_chunks WHERE state IN ('pending', 'running') ORDER BY id"
        )
        .map { ($0[0] ?? "", $0[1] ?? "") }
    }

    /// Whether any of `chunks` has moved past its cursor (or finished) since.
    static func progressed(_ database: FaultDatabase, since chunks: [(id: String, cursor: String)]) async throws -> Bool
    {
        guard !chunks.isEmpty else { return false }
        return try await database.int(
            """
            SELECT count(*) FROM work_chunks c JOIN unnest($1::bigint[], $2::bigint[]) k(id, cursor) ON c.id = k.id
            WHERE c.cursor_user_id > k.cursor OR c.state = 'done'
            """, ["{\(chunks.map(\.id).joined(separator: ","))}", "{\(chunks.map(\.cursor).joined(separator: ","))}"])
            > 0
    }

    /// Claims that took a chunk from another owner while its lease was live (`fault_chunk_log`).
    static func leaseViolations(_ database: FaultDatabase) async throws -> Int {
        try await database.int(
            """
            SELECT count(*) FROM fault_chunk_log
            WHERE old_owner IS DISTINCT FROM new_owner AND old_state = 'running' AND old_lease_until >= statement_now
            """)
    }

    /// One request on a new connection: its status (nil: no complete response) and how long it took.
    static func probe(port: Int, path: String, token: String? = nil, timeout: Duration = .seconds(10)) async -> (
        status: Int?, seconds: Double
    ) {
        let started = ContinuousClock.now
        guard let descriptor = RawHTTP.connect(port: port) else {
            return (nil, (ContinuousClock.now - started).faultSeconds)
        }
        var headers: [String: String] = ["Connection": "close"]
        if let token { headers["Authorization"] = "Bearer \(token)" }
        guard RawHTTP.send(descriptor, RawHTTP.get(path, port: port, headers: headers)) else {
            close(descriptor)
            return (nil, (ContinuousClock.now - started).faultSeconds)
        }
        let outcome = await RawHTTP.readResponses([descriptor], timeout: timeout)
        return (outcome.first?.status, (ContinuousClock.now - started).faultSeconds)
    }

    /// `VmHWM` (peak resident set) of a process, in kB.
    static func peakRSSKilobytes(pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            return Int(line.split(separator: " ").dropFirst().first ?? "")
        }
        return nil
    }

    static func format(_ seconds: Double) -> String { String(format: "%.2f", seconds) }

    /// A sample's value in Prometheus text (`name{labels} value`), 0 when absent.
    static func metric(_ text: String, _ series: String) -> Int {
        for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Int(Double(line.dropFirst(series.count + 1)) ?? 0)
        }
        return 0
    }

    // MARK: wrk

    struct WrkResult: Sendable {
        var statuses: [Int: Int] = [:]
        var requests = 0
        var seconds = 0.0
        var p50ms = 0.0
        var p99ms = 0.0
        var maxms = 0.0
        var errors = (connect: 0, read: 0, write: 0, status: 0, timeout: 0)
        var output = ""

        var rate: Double { self.seconds > 0 ? Double(self.requests) / self.seconds : 0 }
        var summary: String {
            let statuses = self.statuses.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(
                separator: " ")
            return
                "\(self.requests) requests in \(Fault.format(self.seconds)) s (\(Int(self.rate)) req/s), statuses \(statuses), latency p50 \(Fault.format(self.p50ms)) ms p99 \(Fault.format(self.p99ms)) ms max \(Fault.format(self.maxms)) ms, socket errors connect \(self.errors.connect) read \(self.errors.read) write \(self.errors.write) timeout \(self.errors.timeout)"
        }
    }

    /// `wrk`, from `PATH` (`apt-get install wrk`); a failure, never a skip, when it is missing.
    static func wrkBinary() throws -> String {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        let found = (path.split(separator: ":").map { "\($0)/wrk" } + ["/usr/bin/wrk", "/usr/local/bin/wrk"])
            .first { FileManager.default.isExecutableFile(atPath: $0) }
        return try #require(
            found, "wrk is not installed: apt-get install -y wrk (scripts/pg-cluster ensure-packages wrk)")
    }

    /// A wrk Lua script that GETs `/v1/profile/metrics/today` with valid JWTs of `users` (round robin) and prints
    /// the responses by status, the latency percentiles and the socket errors.
    static func wrkScript(users: [Int64]) throws -> String {
        let tokens = users.map { "\"\(TestTokens.user($0, expiresIn: 3 * 3600))\"" }.joined(separator: ",\n")
        let text = """
            tokens = {
            \(tokens)
            }
            counts = {}
            local n = 0
            local threads = {}
            function setup(thread) table.insert(threads, thread) end
            function init(args) n = math.random(#tokens) end
            function request()
              n = n % #tokens + 1
              return wrk.format("GET", "/v1/profile/metrics/today", { ["Authorization"] = "Bearer " .. tokens[n] })
            end
            function response(status, headers, body)
              counts[status] = (counts[status] or 0) + 1
            end
            function done(summary, latency, requests)
              local total = {}
              for _, t in ipairs(threads) do
                local c = t:get("counts")
                for k, v in pairs(c) do total[k] = (total[k] or 0) + v end
              end
              for k, v in pairs(total) do io.write(string.format("FAULT status %d %d\\n", k, v)) end
              io.write(string.format("FAULT latency %.0f %.0f %.0f\\n", latency:percentile(50), latency:percentile(99), latency.max))
              local e = summary.errors
              io.write(string.format("FAULT errors %d %d %d %d %d\\n", e.connect, e.read, e.write, e.status, e.timeout))
              io.write(string.format("FAULT requests %d %.0f\\n", summary.requests, summary.duration))
            end
            """
        let base =
            ProcessInfo.processInfo.environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 }
            ?? NSTemporaryDirectory()
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        let path = URL(fileURLWithPath: base).appendingPathComponent("fault-wrk-\(UUID().uuidString.prefix(8)).lua")
            .path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// A bounded `wrk` run: `connections` connections on 2 threads for `seconds`, 10 s request timeout.
    static func wrk(port: Int, connections: Int, seconds: Int, script: String) async throws -> WrkResult {
        let (status, stdout, stderr) = try await Subprocess.capture(
            try Self.wrkBinary(),
            [
                "-t2", "-c\(connections)", "-d\(seconds)s", "--timeout", "10s", "-s", script,
                "http://127.0.0.1:\(port)/v1/profile/metrics/today",
            ])
        try #require(status == 0, "wrk failed (\(status)): \(stdout)\n\(stderr)")
        var result = WrkResult(output: stdout)
        for line in stdout.split(separator: "\n") where line.hasPrefix("FAULT ") {
            let fields = line.split(separator: " ").dropFirst().map(String.init)
            switch fields.first {
            case "status" where fields.count == 3:
                result.statuses[Int(fields[1]) ?? -1, default: 0] += Int(fields[2]) ?? 0
            case "latency" where fields.count == 4:
                result.p50ms = (Double(fields[1]) ?? 0) / 1000
                result.p99ms = (Double(fields[2]) ?? 0) / 1000
                result.maxms = (Double(fields[3]) ?? 0) / 1000
            case "errors" where fields.count == 6:
                result.errors = (
                    Int(fields[1]) ?? 0, Int(fields[2]) ?? 0, Int(fields[3]) ?? 0, Int(fields[4]) ?? 0,
                    Int(fields[5]) ?? 0
                )
            case "requests" where fields.count == 3:
                result.requests = Int(fields[1]) ?? 0
                result.seconds = (Double(fields[2]) ?? 0) / 1_000_000
            default:
                break
            }
        }
        try #require(result.requests > 0, "wrk made no requests: \(stdout)\n\(stderr)")
        return result
    }
}

/// Probe results collected while a load runs.
final class ProbeLog: Sendable {
    private let items = Mutex<[(status: Int?, seconds: Double)]>([])
    func append(_ item: (status: Int?, seconds: Double)) { self.items.withLock { $0.append(item) } }
    var all: [(status: Int?, seconds: Double)] { self.items.withLock { $0 } }
}

/// Another client taking every connection slot of a server (scenario 8).
final class ConnectionHog: Sendable {
    let url: String
    private let held = Mutex<[UnsafeTransfer<PostgresConnection>]>([])

    init(url: String) {
        self.url = FaultDatabase.url(url, applicationName: "fault-hog")
    }

    /// Opens connections until the server refuses one; keeps trying for `duration` (to take slots as they free up).
    /// - Returns: how many it opened, and the last refusal.
    func fill(for duration: Duration = .zero) async -> (opened: Int, refusal: String?) {
        let deadline = ContinuousClock.now + duration
        var opened = 0
        var refusal: String?
        while true {
            let url = self.url
            let outcome: Result<UnsafeTransfer<PostgresConnection>, any Error>
            do {
                outcome = .success(
                    try await FaultDatabase.threads.runIfActive {
                        UnsafeTransfer(
                            try PostgresConnection(settings: try ConnectionSettings(conninfo: url, environment: [:])))
                    })
            } catch {
                outcome = .failure(error)
            }
            switch outcome {
            case .success(let connection):
                self.held.withLock { $0.append(connection) }
                opened += 1
            case .failure(let error):
                refusal = "\(error)"
                if ContinuousClock.now >= deadline { return (opened, refusal) }
                try? await Task.sleep(for: .milliseconds(5))
            }
        }
    }

    /// Runs a one-value query on one of the held connections.
    func query(_ sql: String) async throws -> String? {
        guard let connection = self.held.withLock({ $0.first }) else { return nil }
        return try await FaultDatabase.threads.runIfActive {
            try connection.value.query(sql).string(0, 0)
        }
    }

    /// Closes every held connection.
    func release() async {
        let connections = self.held.withLock { held in
            let all = held
            held = []
            return all
        }
        _ = try? await FaultDatabase.threads.runIfActive { _ = connections.count }
    }
}

extension Duration {
    /// The duration in seconds, as a `Double`.
    var faultSeconds: Double { Double(self.components.seconds) + Double(self.components.attoseconds) / 1e18 }
}
