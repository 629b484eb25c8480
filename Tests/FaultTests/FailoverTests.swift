import Foundation
import MetricsdTestSupport
import Testing

/// The real `metricsd` binary across a PostgreSQL primary failover: a primary and a streaming standby
/// (``ReplicaPair``, synchronous replication), daemons on the multi-host URL
/// `postgresql://…@127.0.0.1:A,127.0.0.1:B/…?target_session_attrs=read-write`, the primary stopped `-m immediate`
/// and the standby promoted. Every scenario ends with the fault suite's ``Invariant`` check and prints its one-line
/// figure. The scenario with 50,000 users runs only with `METRICSD_LONG_TESTS=1` (a visible gate, not a skip).
@Suite(.serialized) struct FailoverTests {
    /// Faster lease expiry and ticks than production, so that a chunk held by a connection lost with the old
    /// primary is taken back within seconds.
    static let extra = [
        "METRICSD_LEASE_SECONDS": "5", "METRICSD_TICK_SECONDS": "1", "METRICSD_WORKERS": "2",
        "METRICSD_DB_STATEMENT_DEADLINE_SECONDS": "10",
    ]

    /// A failover in the middle of a daily unit of 50,000 users worked by two instances: both stay up, resume on the
    /// promoted standby and finish the unit; no lease is taken over while live; one row per valid user.
    @Test(
        .enabled(if: FaultInjectionTests.long, Comment(rawValue: FaultInjectionTests.longGate)), .timeLimit(.minutes(6))
    )
    func failoverDuringDailyUnit() async throws {
        let started = ContinuousClock.now
        try await withReplicaPair("failover-daily") { pair in
            let url = pair.url()
            try await Fault.migrate(url)
            let database = FaultDatabase(url: url)
            try await database.installAudit()
            let users = 50_000
            try await database.execute(
                Fault.seedSQL(count: users, zones: ["Asia/Kathmandu", "America/Havana", "Europe/Oslo"]))
            let dailyAt = try await Fault.dailyTime(database)
            var extra = Self.extra
            extra["METRICSD_CHUNK_SIZE"] = "2500"
            extra["METRICSD_BATCH_SIZE"] = "250"
            let a = try Fault.start(url, dailyAt: dailyAt, name: "metricsd-a", extra: extra)
            let b = try Fault.start(url, dailyAt: dailyAt, name: "metricsd-b", extra: extra)
            defer {
                a.signal(SIGKILL)
                b.signal(SIGKILL)
            }
            let midway = await Fault.waitUntil(timeout: .seconds(120)) {
                try await database.int("SELECT count(*) FROM profile_metrics") >= users / 10
            }
            try #require(midway != nil, "the unit did not get under way:\n\(a.log.suffix(2000))")

            let promoted = try await pair.failOver()
            let rowsAtFailover = try await database.int("SELECT count(*) FROM profile_metrics")
            #expect(rowsAtFailover < users * 49 / 50, "the failover came after the unit")
            let firstWrite = await Fault.waitUntil(timeout: .seconds(60), poll: .milliseconds(50)) {
                try await database.int("SELECT count(*) FROM profile_metrics") > rowsAtFailover
            }
            let firstWriteSeconds = try #require(
                firstWrite.map { ($0 - promoted).faultSeconds }, "no write on the new primary:\n\(a.log.suffix(3000))")
            let done = await Fault.waitUntil(timeout: .seconds(240)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state <> 'done'") == 0
            }
            let doneSeconds = try #require(
                done.map { ($0 - promoted).faultSeconds },
                "the unit did not finish on the new primary:\n\(a.log.suffix(3000))\n\(b.log.suffix(3000))")
            print(
                "failover-daily: \(rowsAtFailover) of \(users) users' rows written before the failover; first write \(Fault.format(firstWriteSeconds)) s after the promotion, unit done \(Fault.format(doneSeconds)) s after"
            )
            #expect(a.process.isRunning && b.process.isRunning, "an instance exited across the failover")
            #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")
            let ready = await Fault.probe(port: a.port, path: "/readyz")
            #expect(ready.status == 200, "/readyz after the failover: \(String(describing: ready.status))")
            a.signal(SIGTERM)
            b.signal(SIGTERM)
            #expect(await a.waitForExit() == 0)
            #expect(await b.waitForExit() == 0)
            let report = try await Invariant.check(database, scenario: "failover-daily", faults: 1, dailyVersion: 1)
            report.assertHolds()
        }
        print("failover-daily: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// After a failover: `/readyz` is 503 with a reason while no read-write server exists, 200 soon after the
    /// promotion; a settings change made right after the promotion is recomputed within 5 s (the LISTEN connection
    /// moved to the new primary); then the old primary returns as a standby listed *first* in the URL: no connection
    /// of the daemon stays on it and settings changes are still recomputed within 5 s.
    @Test(.timeLimit(.minutes(4))) func settingsAndReturningOldPrimary() async throws {
        let started = ContinuousClock.now
        try await withReplicaPair("failover-settings") { pair in
            let url = pair.url()
            try await Fault.migrate(url)
            let database = FaultDatabase(url: url)
            try await database.installAudit()
            try await database.execute(Fault.seedSQL(count: 2000, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)
            let daemon = try Fault.start(url, dailyAt: dailyAt, name: "metricsd-settings", extra: Self.extra)
            defer { daemon.signal(SIGKILL) }
            try await daemon.waitUntilReady()
            let done = await Fault.waitUntil(timeout: .seconds(90)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
            }
            try #require(done != nil, "units not done:\n\(daemon.log.suffix(2000))")

            // Bounded HTTP load across the failover.
            let script = try Fault.wrkScript(users: Fault.validUserIDs(2000, count: 300))
            async let load = Fault.wrk(port: daemon.port, connections: 8, seconds: 15, script: script)
            try await Task.sleep(for: .seconds(2))
            let before = await Fault.probe(
                port: daemon.port, path: "/v1/profile/metrics/today", token: TestTokens.user(1))
            #expect(before.status == 200, "before the failover: \(String(describing: before.status))")

            // The primary goes; until the standby is promoted (3 s later) no read-write server exists.
            try await pair.crashPrimary()
            let crashed = ContinuousClock.now
            let unready = await Fault.waitUntil(timeout: .seconds(15)) {
                await Fault.probe(port: daemon.port, path: "/readyz").status == 503
            }
            #expect(unready != nil, "/readyz not 503 while only a standby is up")
            let reason = await Self.readyzBody(port: daemon.port)
            #expect(
                reason.contains("no read-write server") || reason.contains("unreachable"), "/readyz reason: \(reason)")
            try await Task.sleep(until: crashed + .seconds(3))
            let promoted = try await pair.promoteStandby()
            let ready = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(50)) {
                await Fault.probe(port: daemon.port, path: "/readyz").status == 200
            }
            let readySeconds = try #require(
                ready.map { ($0 - promoted).faultSeconds }, "/readyz never 200 on the new primary")

            let result = try await load
            let failed = result.requests - (result.statuses[200] ?? 0)
            print(
                "failover-http: wrk \(result.summary); failed \(failed) of \(result.requests); no primary for \(Fault.format((promoted - crashed).faultSeconds)) s; /readyz 200 \(Fault.format(readySeconds)) s after the promotion"
            )
            #expect(
                result.statuses.keys.allSatisfy { $0 == 200 || $0 == 503 },
                "statuses other than 200/503: \(result.statuses)")
            #expect((result.statuses[200] ?? 0) > 0)
            let after = await Fault.probe(
                port: daemon.port, path: "/v1/profile/metrics/today", token: TestTokens.user(1))
            #expect(after.status == 200, "after the promotion: \(String(describing: after.status))")

            let refreshed1 = try await Self.changeAndWait(database, user: 1, weight: "91.25")
            print(
                "failover-settings: /readyz 200 \(Fault.format(readySeconds)) s after the promotion; settings change right after recomputed in \(refreshed1.map { Fault.format($0) } ?? "never") s"
            )
            #expect(
                refreshed1 != nil && refreshed1! < 5,
                "settings change after the promotion not recomputed within 5 s:\n\(daemon.log.suffix(3000))")

            // The old primary returns as a standby of the new one; the daemon's URL lists it first.
            try await pair.rejoinOldPrimary()
            let refreshed2 = try await Self.changeAndWait(database, user: 3, weight: "88.75")
            #expect(
                refreshed2 != nil && refreshed2! < 5,
                "settings change after the old primary's return not recomputed:\n\(daemon.log.suffix(3000))")
            let onStandby =
                Int(
                    try await pair.first.value(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'metricsd-settings'")) ?? -1
            #expect(onStandby == 0, "\(onStandby) daemon connections stay on the read-only old primary")
            #expect(daemon.process.isRunning)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
            // Users 1 and 3 were written twice on purpose: the daily run, then exactly one refresh after their
            // settings changed. Anything more is a duplicate; the refresh itself is taken out of the audit.
            let writes = try await database.rows(
                "SELECT user_id, count(*) FROM fault_audit WHERE user_id IN (1, 3) GROUP BY user_id ORDER BY user_id")
            #expect(writes == [["1", "2"], ["3", "2"]], "writes of the changed users: \(writes)")
            try await database.execute(
                """
                DELETE FROM fault_audit a WHERE a.user_id IN (1, 3)
                  AND a.at = (SELECT max(b.at) FROM fault_audit b WHERE b.user_id = a.user_id)
                """)
            let report = try await Invariant.check(database, scenario: "failover-settings", faults: 2, dailyVersion: 1)
            report.assertHolds()
        }
        print("failover-settings: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// A failover in the middle of a recompute-all job (formula version 2): the job resumes on the new primary and
    /// completes; one row per valid user with the new version.
    @Test(.timeLimit(.minutes(4))) func failoverDuringRecomputeJob() async throws {
        let started = ContinuousClock.now
        try await withReplicaPair("failover-recompute") { pair in
            let url = pair.url()
            try await Fault.migrate(url)
            let database = FaultDatabase(url: url)
            try await database.installAudit()
            let zones = ["Europe/Paris", "Pacific/Chatham"]
            try await database.execute(Fault.seedSQL(count: 4000, zones: zones))
            let dailyAt = try await Fault.dailyTime(database)
            try await Fault.leaveVersion2ToTheJob(database, zones: zones)
            var extra = Self.extra
            extra["METRICSD_TEST_FORMULA_VERSION"] = "2"
            extra["METRICSD_CHUNK_SIZE"] = "1000"
            extra["METRICSD_BATCH_SIZE"] = "100"
            extra["METRICSD_FAULTS"] = "batch-delay-ms=40"
            let trigger = try await Subprocess.run(
                try DaemonProcess.binary(), ["recompute-all"],
                environment: ["DATABASE_URL": url, "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_CHUNK_SIZE": "1000"])
            try #require(trigger.status == 0, "\(trigger.output)")
            let daemon = try Fault.start(url, dailyAt: dailyAt, name: "metricsd-recompute", extra: extra)
            defer { daemon.signal(SIGKILL) }
            let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                try await database.int("SELECT count(*) FROM profile_metrics WHERE version = 2") >= 800
            }
            try #require(midway != nil, "the job did not get under way:\n\(daemon.log.suffix(2000))")
            let promoted = try await pair.failOver()
            let rowsAtFailover = try await database.int("SELECT count(*) FROM profile_metrics WHERE version = 2")
            #expect(rowsAtFailover < 3900, "the failover came after the job")
            let done = await Fault.waitUntil(timeout: .seconds(120)) {
                try await database.value("SELECT state FROM recompute_jobs") == "done"
            }
            let doneSeconds = try #require(
                done.map { ($0 - promoted).faultSeconds }, "job not done:\n\(daemon.log.suffix(3000))")
            print(
                "failover-recompute: \(rowsAtFailover) rows before the failover; job done \(Fault.format(doneSeconds)) s after the promotion"
            )
            #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")
            #expect(daemon.process.isRunning)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let report = try await Invariant.check(database, scenario: "failover-recompute", faults: 1)
            report.assertHolds()
        }
        print("failover-recompute: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// Asynchronous replication (documented, not recommended): a failover may lose the transactions the standby
    /// had not received yet. The test measures how many committed rows the promoted standby lacks, and shows
    /// that metricsd recomputes them from the settings (the chunk cursors committed with those rows are lost
    /// with them) without ever writing a second row for a key that survived.
    @Test(.timeLimit(.minutes(4))) func asynchronousReplicationFailover() async throws {
        let started = ContinuousClock.now
        try await withReplicaPair("failover-async", synchronous: false) { pair in
            let url = pair.url()
            try await Fault.migrate(url)
            let database = FaultDatabase(url: url)
            try await database.installAudit()
            let users = 8000
            try await database.execute(Fault.seedSQL(count: users, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)
            var extra = Self.extra
            extra["METRICSD_CHUNK_SIZE"] = "1000"
            extra["METRICSD_BATCH_SIZE"] = "200"
            let daemon = try Fault.start(url, dailyAt: dailyAt, name: "metricsd-async", extra: extra)
            defer { daemon.signal(SIGKILL) }
            let midway = await Fault.waitUntil(timeout: .seconds(60), poll: .milliseconds(20)) {
                try await database.int("SELECT count(*) FROM profile_metrics") >= users / 4
            }
            try #require(midway != nil, "the unit did not get under way:\n\(daemon.log.suffix(2000))")
            try await pair.crashPrimary()
            // What survived: read on the standby before it is promoted (nothing writes to it yet).
            let survived = Int(try await pair.second.value("SELECT count(*) FROM profile_metrics")) ?? -1
            let promoted = try await pair.promoteStandby()
            let done = await Fault.waitUntil(timeout: .seconds(120)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state <> 'done'") == 0
            }
            let doneSeconds = try #require(
                done.map { ($0 - promoted).faultSeconds }, "unit not done:\n\(daemon.log.suffix(3000))")
            #expect(survived > 0)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let report = try await Invariant.check(database, scenario: "failover-async", faults: 1, dailyVersion: 1)
            report.assertHolds()
            // What the old primary had committed (it is started alone, after the daemon is gone).
            try await pair.startOldPrimaryAlone()
            let committedOnOld = Int(try await pair.first.value("SELECT count(*) FROM profile_metrics")) ?? -1
            let lost = committedOnOld - survived
            print(
                "failover-async: the old primary had committed \(committedOnOld) rows, the promoted standby \(survived): \(lost) committed rows lost by the failover, all recomputed; unit done \(Fault.format(doneSeconds)) s after the promotion"
            )
            #expect(lost >= 0, "the standby had rows the primary had not")
        }
        print("failover-async: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// The promoted standby kept the `synchronous_standby_names` it inherited, so every COMMIT on it waits for a
    /// standby that does not exist (how a hand-made failover strands a job queue). The daemon must not wait with
    /// it: statements are cancelled at the deadline, `/readyz` says 503 "database not answering", the status line
    /// does not say "idle", the process stays up; once the setting is cleared the unit finishes, exactly once.
    @Test(.timeLimit(.minutes(4))) func promotedStandbyWaitingForSynchronousStandby() async throws {
        let started = ContinuousClock.now
        try await withReplicaPair("failover-syncwait") { pair in
            let url = pair.url()
            try await Fault.migrate(url)
            let database = FaultDatabase(url: url)
            try await database.installAudit()
            try await database.execute(Fault.seedSQL(count: 4000, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)
            var extra = Self.extra
            extra["METRICSD_DB_STATEMENT_DEADLINE_SECONDS"] = "3"
            extra["METRICSD_CHUNK_SIZE"] = "1000"
            extra["METRICSD_BATCH_SIZE"] = "100"
            extra["METRICSD_FAULTS"] = "batch-delay-ms=40"
            let daemon = try Fault.start(url, dailyAt: dailyAt, name: "metricsd-syncwait", extra: extra)
            defer { daemon.signal(SIGKILL) }
            let midway = await Fault.waitUntil(timeout: .seconds(60)) {
                try await database.int("SELECT count(*) FROM profile_metrics") >= 600
            }
            try #require(midway != nil, "the unit did not get under way:\n\(daemon.log.suffix(2000))")
            try await pair.crashPrimary()
            let promoted = try await pair.promoteStandby(keepSync: true)
            let unready = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(200)) {
                await Self.readyzBody(port: daemon.port).contains("not answering")
            }
            let lastReadyz = await Self.readyzBody(port: daemon.port)
            let unreadySeconds = try #require(
                unready.map { ($0 - promoted).faultSeconds },
                "/readyz never said the database is not answering: \(lastReadyz)\n\(daemon.log.suffix(3000))")
            let noted = await Fault.waitUntil(timeout: .seconds(20)) {
                daemon.log.contains("no answer from the database within 3 s")
            }
            #expect(noted != nil, "no statement was cancelled at the deadline:\n\(daemon.log.suffix(3000))")
            #expect(daemon.process.isRunning)

            _ = try await pair.second.value("ALTER SYSTEM RESET synchronous_standby_names")
            _ = try await pair.second.value("SELECT pg_reload_conf()")
            let fixed = ContinuousClock.now
            let done = await Fault.waitUntil(timeout: .seconds(90)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state <> 'done'") == 0
            }
            let doneSeconds = try #require(
                done.map { ($0 - fixed).faultSeconds }, "unit not done:\n\(daemon.log.suffix(3000))")
            print(
                "failover-syncwait: /readyz 503 'database not answering' \(Fault.format(unreadySeconds)) s after the promotion; unit done \(Fault.format(doneSeconds)) s after synchronous_standby_names was cleared"
            )
            #expect(try await Fault.leaseViolations(database) == 0, "a chunk was taken over under a live lease")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let report = try await Invariant.check(database, scenario: "failover-syncwait", faults: 2, dailyVersion: 1)
            report.assertHolds()
        }
        print("failover-syncwait: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// The body of `/readyz`.
    static func readyzBody(port: Int) async -> String {
        guard let descriptor = RawHTTP.connect(port: port) else { return "" }
        guard RawHTTP.send(descriptor, RawHTTP.get("/readyz", port: port, headers: ["Connection": "close"])) else {
            close(descriptor)
            return ""
        }
        let outcome = await RawHTTP.readResponses([descriptor], timeout: .seconds(10))  // closes it
        if case .complete(_, let body)? = outcome.first { return body }
        return ""
    }

    /// Changes a user's weight and waits (up to `timeout`) until the row is recomputed; the seconds it took, or nil.
    static func changeAndWait(
        _ database: FaultDatabase, user: Int, weight: String, timeout: Duration = .seconds(10)
    ) async throws -> Double? {
        let before = try await database.value("SELECT computed_at::text FROM profile_metrics WHERE user_id = \(user)")
        let changed = ContinuousClock.now
        try await database.execute("UPDATE user_settings SET current_weight = \(weight) WHERE user_id = \(user)")
        let refreshed = await Fault.waitUntil(timeout: timeout, poll: .milliseconds(50)) {
            try await database.value("SELECT computed_at::text FROM profile_metrics WHERE user_id = \(user)") != before
        }
        return refreshed.map { ($0 - changed).faultSeconds }
    }
}
