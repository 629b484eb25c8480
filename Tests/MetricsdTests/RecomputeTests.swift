import Foundation
import HTTPTypes
import HummingbirdTesting
import HealthMetrics
import MetricsdPostgres
import Testing

/// Recompute-all after a formula version bump (a second version is rehearsed with the same maths).
@Suite struct RecomputeTests {
    static let v2 = MetricsFormula.rehearsal(version: 2)

    /// `count` users over a few zones, every 50th with a bad height, all with a version 1 row for today.
    static func seedWithVersion1(_ database: TestDatabase, count: Int) async throws {
        try await database.execute(
            """
            INSERT INTO users (id, timezone)
            SELECT g, (ARRAY['UTC','Asia/Kathmandu','America/Havana','Pacific/Kiritimati','Etc/GMT+12'])[1 + g % 5]
            FROM generate_series(1, \(count)) g;
            INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level, onboarding_completed)
            SELECT id, date '1980-01-01' + (id % 9000)::int, (ARRAY['male','female','other'])[1 + id % 3], 45 + (id % 80),
                   CASE WHEN id % 50 = 0 THEN 72 ELSE 150 + (id % 60) END, 'lightly_active', true FROM users;
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date)
            SELECT id, 22.0, 1500, 2000, 1, (now() AT TIME ZONE timezone)::date FROM users WHERE id % 50 <> 0;
            ANALYZE;
            """)
    }

    static func drain(_ queue: WorkQueue) async throws {
        while let chunk = try await queue.claim() {
            _ = try await queue.process(chunk)
        }
        _ = try await queue.finishCompleted()
    }

    @Test func fiftyThousandUsersGetTheNewVersionOnce() async throws {
        try await withTestDatabase(poolSize: 4) { database in
            try await Self.seedWithVersion1(database, count: 50_000)
            let store1 = PostgresStore(pool: database.pool, formula: .v1, logger: database.logger)
            let before = try #require(try await store1.latestMetrics(userID: 7))
            #expect(try await store1.acknowledge(userID: 7, version: 1, computedAt: before.computedAt) != .notCurrent)

            let jobs = RecomputeJobs(pool: database.pool)
            let (job, created) = try await jobs.trigger(version: 2, requestedBy: "test")
            #expect(created)
            #expect(job.usersTotal == 50_000)
            let queue = WorkQueue(pool: database.pool, formula: Self.v2, owner: "w", logger: database.logger)
            async let first: Void = Self.drain(queue)
            async let second: Void = Self.drain(queue)
            _ = try await (first, second)

            let finished = try #require(try await jobs.job(id: job.id))
            #expect(finished.state == .done)
            #expect(finished.usersDone == 49_000)
            #expect(finished.usersSkipped == 1_000)
            #expect(finished.percent == 100)
            #expect(try await database.value(
                "SELECT count(*) FROM profile_metrics WHERE version = 2 AND metrics_date = (SELECT (now() AT TIME ZONE u.timezone)::date FROM users u WHERE u.id = user_id)") == "49000")
            #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2 AND user_id % 50 = 0") == "0")
            #expect(try await database.value(
                "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d") == "0")
            #expect(try await database.value("SELECT count(*) FROM metrics_skips WHERE source = 'recompute'") == "1000")

            let store2 = PostgresStore(pool: database.pool, formula: Self.v2, logger: database.logger)
            let after = try #require(try await store2.latestMetrics(userID: 7))
            #expect(after.metrics.version == 2)
            #expect(after.acknowledgedAt == nil, "the version 1 acknowledgement no longer counts")
            #expect(try await store2.acknowledge(userID: 7, version: 1, computedAt: before.computedAt) == .notCurrent)

            // A repeated job writes nothing.
            let again = try await jobs.trigger(version: 2, requestedBy: "test")
            #expect(again.created)
            let rowsBefore = try await database.value("SELECT sum(xmin::text::bigint) FROM profile_metrics WHERE version = 2")
            try await Self.drain(queue)
            #expect(try await database.value("SELECT sum(xmin::text::bigint) FROM profile_metrics WHERE version = 2") == rowsBefore)
            #expect(try await jobs.job(id: again.job.id)?.usersDone == 49_000)
        }
    }

    @Test func triggeringTwiceGivesOneJobAndCancelThenRetriggerCompletes() async throws {
        try await withTestDatabase { database in
            try await Self.seedWithVersion1(database, count: 3_000)
            let jobs = RecomputeJobs(pool: database.pool, chunkSize: 500)
            let (job, created) = try await jobs.trigger(version: 2, requestedBy: "test")
            let (same, createdAgain) = try await jobs.trigger(version: 2, requestedBy: "test")
            #expect(created && !createdAgain)
            #expect(same.id == job.id)

            var configuration = WorkQueue.Configuration()
            configuration.batchSize = 100
            let queue = WorkQueue(pool: database.pool, formula: Self.v2, owner: "w", configuration: configuration, logger: database.logger)
            let chunk = try #require(try await queue.claim())
            _ = try await queue.process(chunk)
            guard case .cancelled(let cancelled) = try await jobs.cancel(id: job.id) else {
                Issue.record("expected the job to be cancelled")
                return
            }
            #expect(cancelled.state == .cancelled)
            #expect(cancelled.usersDone + cancelled.usersSkipped == 500)
            #expect(try await queue.claim() == nil, "a cancelled job's chunks are not claimed")
            guard case .alreadyFinished = try await jobs.cancel(id: job.id) else {
                Issue.record("cancelling twice is a conflict")
                return
            }
            #expect(try await jobs.cancel(id: 999) == .notFound)

            let (next, nextCreated) = try await jobs.trigger(version: 2, requestedBy: "test")
            #expect(nextCreated && next.id != job.id)
            try await Self.drain(queue)
            #expect(try await jobs.job(id: next.id)?.state == .done)
            #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2") == "2940")
            #expect(try await database.value(
                "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d") == "0")
        }
    }

    /// Daily chunks are claimed before recompute chunks: a unit that falls due during a long recompute runs on
    /// the next claim, not after the job.
    @Test func dailyUnitDuringARecomputeRunsFirst() async throws {
        try await withTestDatabase { database in
            try await Self.seedWithVersion1(database, count: 5_000)
            let jobs = RecomputeJobs(pool: database.pool, chunkSize: 250)
            _ = try await jobs.trigger(version: 2, requestedBy: "test")
            let queue = WorkQueue(pool: database.pool, formula: Self.v2, owner: "w", logger: database.logger)
            let recompute = try #require(try await queue.claim())
            guard case .recompute = recompute.kind else {
                Issue.record("expected a recompute chunk first")
                return
            }
            _ = try await queue.process(recompute)
            // 00:05 in Kathmandu (and every zone already past its daily time) falls due now.
            let units = try await queue.enqueueDueUnits(dailyAt: .default)
            #expect(!units.isEmpty)
            let next = try #require(try await queue.claim())
            guard case .daily = next.kind else {
                Issue.record("the daily chunk must come before the remaining recompute chunks")
                return
            }
            #expect(try await database.value("SELECT count(*) FROM work_chunks WHERE kind = 'recompute' AND state = 'pending'") == "19")
        }
    }

    /// A worker process killed mid-job (no clean stop) and restarted: the job resumes from its cursors once the
    /// leases expire, and the rows are exactly one per valid user. Two instances share the job.
    @Test func killedMidJobResumesAndTwoInstancesShareIt() async throws {
        try await withTestDatabase { database in
            try await Self.seedWithVersion1(database, count: 20_000)
            let extra = [
                "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_LEASE_SECONDS": "2", "METRICSD_CHUNK_SIZE": "1000",
                "METRICSD_BATCH_SIZE": "200", "METRICSD_FAULTS": "batch-delay-ms=40", "METRICSD_WORKERS": "2",
            ]
            let trigger = try DaemonProcess(
                arguments: ["recompute-all"], environment: ["DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2"])
            #expect(await trigger.waitForExit() == 0)
            #expect(trigger.log.contains("recompute job 1 created for formula version 2 (20000 users)"), "\(trigger.log)")

            let portA = DaemonProcess.freePort()
            let a = try DaemonProcess(environment: DaemonProcess.environment(databaseURL: database.url, port: portA, extra: extra), port: portA)
            let started = await DaemonProcess.eventually(timeout: .seconds(30)) {
                Int((try? await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2")) ?? "0")! > 2_000
            }
            #expect(started)
            a.signal(SIGKILL)
            _ = await a.waitForExit()
            let afterKill = Int(try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2") ?? "0")!
            #expect(afterKill < 19_600, "killed mid-job")

            let portB = DaemonProcess.freePort()
            let portC = DaemonProcess.freePort()
            let b = try DaemonProcess(environment: DaemonProcess.environment(databaseURL: database.url, port: portB, extra: extra), port: portB)
            let c = try DaemonProcess(environment: DaemonProcess.environment(databaseURL: database.url, port: portC, extra: extra), port: portC)
            let done = await DaemonProcess.eventually(timeout: .seconds(120)) {
                (try? await database.value("SELECT state FROM recompute_jobs WHERE id = 1")) == "done"
            }
            #expect(done, "job not done; logs:\n\(b.log.suffix(1500))")
            #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2") == "19600")
            #expect(try await database.value(
                "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d") == "0")
            let owners = try await database.rows(
                "SELECT DISTINCT split_part(lease_owner, ':', 2) FROM work_chunks WHERE kind = 'recompute' AND state = 'done'")
                .compactMap { $0.first ?? nil }
            #expect(owners.contains(String(b.pid)) && owners.contains(String(c.pid)), "both instances made progress: \(owners)")

            // The progress document over HTTP and on the command line.
            let admin = TestTokens.bearer(DaemonProcess.secrets.adminToken)
            let response = try await b.request("/v1/admin/recompute/1", headers: admin)
            #expect(response.status == .ok)
            let job = try #require(try response.json()["data"] as? [String: Any])["job"] as? [String: Any]
            #expect(job?["state"] as? String == "done")
            #expect(job?["usersDone"] as? Int == 19_600)
            #expect(job?["usersSkipped"] as? Int == 400)
            let status = try DaemonProcess(
                arguments: ["recompute-status", "1"], environment: ["DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2"])
            #expect(await status.waitForExit() == 0)
            #expect(status.log.contains("job 1  version 2  done  100.0%  20000/20000 users  skipped 400"), "\(status.log)")
            b.signal(SIGTERM)
            c.signal(SIGTERM)
            #expect(await b.waitForExit() == 0)
            #expect(await c.waitForExit() == 0)
        }
    }

    @Test func adminAPIAndWaitingCommandLine() async throws {
        try await withTestDatabase { database in
            try await Self.seedWithVersion1(database, count: 2_000)
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port, extra: ["METRICSD_TEST_FORMULA_VERSION": "2"]),
                port: port)
            try await daemon.waitUntilReady()
            #expect(try await daemon.request("/v1/admin/recompute", method: .post).status == .unauthorized)
            #expect(try await daemon.request("/v1/admin/recompute", method: .post, headers: TestTokens.bearer("wrong-admin-token-123456")).status == .unauthorized)
            #expect(try await daemon.request("/v1/admin/recompute", method: .post, headers: TestTokens.bearer(TestTokens.user(1))).status == .unauthorized)
            let admin = TestTokens.bearer(DaemonProcess.secrets.adminToken)
            let accepted = try await daemon.request("/v1/admin/recompute", method: .post, headers: admin)
            #expect(accepted.status == .accepted || accepted.status == .ok)
            let location = try #require(accepted.headers[.location])
            #expect(location.hasPrefix("/v1/admin/recompute/"))

            let wait = try DaemonProcess(
                arguments: ["recompute-all", "--wait"],
                environment: ["DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2"])
            #expect(await wait.waitForExit(timeout: .seconds(60)) == 0, "\(wait.log)")
            #expect(wait.log.contains("done: 1960 users computed, 40 skipped"), "\(wait.log)")
            let progress = try await daemon.request(location, headers: admin)
            let job = try #require(try progress.json()["data"] as? [String: Any])["job"] as? [String: Any]
            #expect(job?["state"] as? String == "done")
            #expect(job?["percent"] as? Double == 100)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
