import Foundation
import HTTPTypes
import HealthMetrics
import HummingbirdTesting
import MetricsdPostgres
import MetricsdReads
import MetricsdTestSupport
import MetricsdWork
import Testing

/// Recompute-all after a formula version bump (a second version is rehearsed with the same maths).
@Suite struct RecomputeTests {
    static let v2 = MetricsFormula.rehearsal(version: 2)

    /// `count` users over `zones` (by default five far apart, UTC+14 and UTC−12 among them), every 50th with a bad
    /// height, all with a version 1 row for today.
    static func seedWithVersion1(
        _ database: TestDatabase, count: Int, zones: [String] = TestDatabase.recomputeZones
    ) async throws {
        try await database.seedWithVersion1(count: count, zones: zones)
    }

    /// The job a trigger created; records an issue (and throws) when it did not create one.
    static func created(_ outcome: RecomputeJobs.TriggerOutcome, sourceLocation: SourceLocation = #_sourceLocation)
        throws
        -> RecomputeJob
    {
        try #require(
            outcome.created ? outcome.job : nil, "expected a new job, got \(outcome)", sourceLocation: sourceLocation)
    }

    static func drain(_ queue: WorkQueue) async throws {
        while let chunk = try await queue.claim() {
            _ = try await queue.process(chunk)
        }
        _ = try await queue.finishCompleted()
    }

    @Test func fiftyThousandUsersGetTheNewVersionOnce() async throws {
        try await withTestDatabase(poolSize: 4) { database in
            // Five zones whose local time is between 01:00 and 22:00, so that no midnight falls within the test's
            // minute or two: the job writes each user's row for their local date, and the count of today's rows and
            // the triggers' "nothing to do" are about that date.
            let zones = try await database.rows(
                """
                SELECT name FROM pg_timezone_names
                WHERE name IN ('UTC', 'Asia/Kathmandu', 'America/Havana', 'Pacific/Kiritimati', 'Etc/GMT+12', 'Asia/Tokyo',
                               'Europe/Berlin', 'America/Los_Angeles', 'Asia/Kolkata', 'Australia/Sydney')
                  AND (now() AT TIME ZONE name)::time BETWEEN time '01:00' AND time '22:00'
                ORDER BY name LIMIT 5
                """
            ).compactMap { $0.first ?? nil }
            try #require(zones.count == 5, "need five zones between 01:00 and 22:00 local time: \(zones)")
            try await Self.seedWithVersion1(database, count: 50_000, zones: zones)
            let store1 = PostgresStore(pool: database.pool, formula: .v1, logger: database.logger)
            try await store1.serving {
                let before = try #require(try await store1.latestMetrics(userID: 7))
                #expect(
                    try await store1.acknowledge(userID: 7, version: 1, computedAt: before.computedAt) != .notCurrent)

                let jobs = RecomputeJobs(pool: database.pool)
                let job = try Self.created(try await jobs.trigger(version: 2, requestedBy: "test"))
                #expect(job.usersTotal == 50_000)
                let queue = WorkQueue(pool: database.pool, formula: Self.v2, owner: "w", logger: database.logger)
                async let first: Void = Self.drain(queue)
                async let second: Void = Self.drain(queue)
                _ = try await (first, second)

                let finished = try #require(try await jobs.job(id: job.id))
                #expect(finished.state == .done)
                #expect(finished.usersExamined == 50_000)
                #expect(finished.usersWritten == 49_000)
                #expect(finished.usersAlreadyCurrent == 0)
                #expect(finished.usersSkipped == 1_000)
                #expect(finished.percent == 100)
                #expect(
                    try await database.value(
                        "SELECT count(*) FROM profile_metrics WHERE version = 2 AND metrics_date = (SELECT (now() AT TIME ZONE u.timezone)::date FROM users u WHERE u.id = user_id)"
                    ) == "49000")
                #expect(
                    try await database.value(
                        "SELECT count(*) FROM profile_metrics WHERE version = 2 AND user_id % 50 = 0") == "0")
                #expect(
                    try await database.value(
                        "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                    ) == "0")
                #expect(
                    try await database.value("SELECT count(*) FROM metrics_skips WHERE source = 'recompute'") == "1000")

                let store2 = PostgresStore(pool: database.pool, formula: Self.v2, logger: database.logger)
                try await store2.serving {
                    let after = try #require(try await store2.latestMetrics(userID: 7))
                    #expect(after.metrics.version == 2)
                    #expect(after.acknowledgedAt == nil, "the version 1 acknowledgement no longer counts")
                    #expect(
                        try await store2.acknowledge(userID: 7, version: 1, computedAt: before.computedAt)
                            == .notCurrent)

                    // Triggering again: every user is current (a row, or a skip verdict newer than the settings), so no job;
                    // the answer is the finished one.
                    #expect(try await jobs.trigger(version: 2, requestedBy: "test") == .nothingToDo(latest: finished))
                    #expect(try await database.value("SELECT count(*) FROM recompute_jobs") == "1")
                    // A settings change that makes a skipped user valid gives the next trigger work again.
                    try await database.execute("UPDATE user_settings SET height = 170 WHERE user_id = 50")
                    let next = try Self.created(try await jobs.trigger(version: 2, requestedBy: "test"))
                    try await Self.drain(queue)
                    let nextDone = try #require(try await jobs.job(id: next.id))
                    #expect(nextDone.usersWritten == 1)
                    #expect(nextDone.usersAlreadyCurrent == 49_000)
                    #expect(nextDone.usersSkipped == 999)
                    #expect(nextDone.usersExamined == 50_000)
                }
            }
        }
    }

    @Test func triggeringTwiceGivesOneJobAndCancelThenRetriggerCompletes() async throws {
        try await withTestDatabase { database in
            try await Self.seedWithVersion1(database, count: 3_000)
            let jobs = RecomputeJobs(pool: database.pool, chunkSize: 500)
            // Eight triggers at once (as from several instances): one job.
            let outcomes = try await withThrowingTaskGroup(of: RecomputeJobs.TriggerOutcome.self) { group in
                for _ in 0..<8 { group.addTask { try await jobs.trigger(version: 2, requestedBy: "test") } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.filter(\.created).count == 1, "\(outcomes)")
            let job = try #require(outcomes.first(where: \.created)?.job)
            #expect(outcomes.allSatisfy { $0.job?.id == job.id }, "\(outcomes)")
            #expect(try await database.value("SELECT count(*) FROM recompute_jobs") == "1")

            var configuration = WorkQueue.Configuration()
            configuration.batchSize = 100
            let queue = WorkQueue(
                pool: database.pool, formula: Self.v2, owner: "w", configuration: configuration, logger: database.logger
            )
            let chunk = try #require(try await queue.claim())
            _ = try await queue.process(chunk)
            guard case .cancelled(let cancelled) = try await jobs.cancel(id: job.id) else {
                Issue.record("expected the job to be cancelled")
                return
            }
            #expect(cancelled.state == .cancelled)
            #expect(cancelled.usersExamined == 500)
            #expect(try await queue.claim() == nil, "a cancelled job's chunks are not claimed")
            guard case .alreadyFinished = try await jobs.cancel(id: job.id) else {
                Issue.record("cancelling twice is a conflict")
                return
            }
            #expect(try await jobs.cancel(id: 999) == .notFound)

            let next = try Self.created(try await jobs.trigger(version: 2, requestedBy: "test"))
            #expect(next.id != job.id)
            try await Self.drain(queue)
            #expect(try await jobs.job(id: next.id)?.state == .done)
            #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2") == "2940")
            #expect(
                try await database.value(
                    "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                ) == "0")
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
            #expect(
                try await database.value(
                    "SELECT count(*) FROM work_chunks WHERE kind = 'recompute' AND state = 'pending'") == "19")
        }
    }

    /// A worker process killed mid-job (no clean stop) and restarted: the job resumes from its cursors once the
    /// leases expire, and the rows are exactly one per valid user. Two instances share the job.
    @Test func killedMidJobResumesAndTwoInstancesShareIt() async throws {
        try await withTestDatabase { database in
            try await Self.seedWithVersion1(database, count: 20_000)
            // Only the job writes version 2: its daily units count as done already. (Otherwise, within five minutes
            // after a seeded zone's midnight, the daemons' due unit would be the previous date's, and write a second
            // version-2 row for each of its users.)
            try await database.execute(
                """
                INSERT INTO daily_units (timezone, local_date, version, timezone_known, state, users_total, created_at)
                SELECT DISTINCT timezone, date '2999-12-31', 2, true, 'done', 0, now() FROM users
                """)
            // Each batch of 200 takes at least 150 ms, so the job outlasts the second instance's start by seconds
            // even on a loaded machine (at 40 ms, one instance once finished it before the other claimed a chunk).
            let extra = [
                "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_LEASE_SECONDS": "2", "METRICSD_CHUNK_SIZE": "1000",
                "METRICSD_BATCH_SIZE": "200", "METRICSD_FAULTS": "batch-delay-ms=150", "METRICSD_WORKERS": "2",
            ]
            let trigger = try DaemonProcess(
                arguments: ["recompute-all"],
                environment: ["DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2"])
            #expect(await trigger.waitForExit() == 0)
            #expect(
                trigger.log.contains("recompute job 1 created for formula version 2 (20000 users)"), "\(trigger.log)")

            let portA = DaemonProcess.freePort()
            let a = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: portA, extra: extra),
                port: portA)
            let started = await DaemonProcess.eventually(timeout: .seconds(30)) {
                Int((try? await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2")) ?? "0")!
                    > 2_000
            }
            #expect(started)
            a.signal(SIGKILL)
            _ = await a.waitForExit()
            let afterKill = Int(
                try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2") ?? "0")!
            #expect(afterKill < 19_600, "killed mid-job")

            let portB = DaemonProcess.freePort()
            let portC = DaemonProcess.freePort()
            let b = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: portB, extra: extra),
                port: portB)
            let c = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: portC, extra: extra),
                port: portC)
            let done = await DaemonProcess.eventually(timeout: .seconds(120)) {
                (try? await database.value("SELECT state FROM recompute_jobs WHERE id = 1")) == "done"
            }
            #expect(done, "job not done; logs:\n\(b.log.suffix(1500))")
            #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2") == "19600")
            #expect(
                try await database.value(
                    "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                ) == "0")
            let owners = try await database.rows(
                "SELECT DISTINCT split_part(lease_owner, ':', 2) FROM work_chunks WHERE kind = 'recompute' AND state = 'done'"
            )
            .compactMap { $0.first ?? nil }
            #expect(
                owners.contains(String(b.pid)) && owners.contains(String(c.pid)),
                "both instances made progress: \(owners)")

            // The chunks A held when it died were taken over, named and counted.
            var takenOver = 0.0
            for daemon in [b, c] {
                let scraped = try await PrometheusScrape.scrape(daemon)
                for kind in ["daily", "recompute"] {
                    takenOver +=
                        PrometheusScrape.value(scraped, "metricsd_work_leases_taken_over_total", ["kind": kind]) ?? 0
                }
            }
            #expect(takenOver >= 1, "no lease taken over from the killed instance")
            #expect(
                (b.log + c.log).contains("Took over a chunk whose lease another instance let expire"),
                "\(b.log.suffix(1500))")
            #expect((b.log + c.log).contains(":\(a.pid):"), "the previous owner (instance of pid \(a.pid)) is named")

            // The progress document over HTTP and on the command line.
            let admin = TestTokens.bearer(DaemonProcess.secrets.adminToken)
            let response = try await b.request("/v1/admin/recompute/1", headers: admin)
            #expect(response.status == .ok)
            let job = try #require(try response.json()["data"] as? [String: Any])["job"] as? [String: Any]
            #expect(job?["state"] as? String == "done")
            #expect((job?["usersWritten"] as? Int ?? 0) + (job?["usersAlreadyCurrent"] as? Int ?? 0) == 19_600)
            #expect(job?["usersExamined"] as? Int == 20_000)
            #expect(job?["usersSkipped"] as? Int == 400)
            let status = try DaemonProcess(
                arguments: ["recompute-status", "1"],
                environment: ["DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2"])
            #expect(await status.waitForExit() == 0)
            // (The version-2 daily units ran too, so the split between written and already current varies.)
            #expect(
                status.log.contains("job 1  version 2  done  100.0%  20000/20000 users examined  written "),
                "\(status.log)")
            #expect(status.log.contains("  skipped 400  "), "\(status.log)")
            b.signal(SIGTERM)
            c.signal(SIGTERM)
            #expect(await b.waitForExit() == 0, "\(b.log.suffix(3000))")
            #expect(await c.waitForExit() == 0, "\(c.log.suffix(3000))")
        }
    }

    /// The admin API, the command line, the log and `/metrics` tell one story of a job, in the same words;
    /// `recompute-all --wait` returns right when the job ends; a second trigger after it makes no job.
    @Test func adminAPIAndWaitingCommandLine() async throws {
        try await withTestDatabase { database in
            // One zone whose local time is between 01:00 and 22:00, with the daily time at 23:59: the version-2 daily
            // unit is for yesterday, so it does not touch today's rows and the job's counts are exact.
            let zone = try #require(
                try await database.value(
                    """
                    SELECT name FROM pg_timezone_names
                    WHERE name IN ('UTC', 'Asia/Tokyo', 'America/New_York', 'Asia/Kolkata', 'America/Los_Angeles')
                      AND (now() AT TIME ZONE name)::time BETWEEN time '01:00' AND time '22:00'
                    ORDER BY name LIMIT 1
                    """))
            try await Self.seedWithVersion1(database, count: 2_000)
            // 98 valid users already have today's version-2 row: the job finds them already current.
            try await database.execute(
                """
                UPDATE users SET timezone = '\(zone)';
                UPDATE profile_metrics SET metrics_date = (now() AT TIME ZONE '\(zone)')::date;
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date)
                SELECT id, 22.0, 1500, 2000, 2, (now() AT TIME ZONE '\(zone)')::date FROM users
                WHERE id <= 100 AND id % 50 <> 0;
                SET session_replication_role = replica;
                UPDATE user_settings SET updated_at = now() - interval '1 day';
                SET session_replication_role = DEFAULT;
                """)  // (settings changed long ago: the start-up sweep of recent changes computes nobody)
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: [
                        "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_DAILY_AT": "23:59",
                        "METRICSD_CHUNK_SIZE": "1000",
                        "METRICSD_BATCH_SIZE": "200", "METRICSD_FAULTS": "batch-delay-ms=60",
                    ]),
                port: port)
            try await daemon.waitUntilReady()
            // The version-2 daily unit (yesterday's date) first, so its skip verdicts do not replace the job's.
            let dailyDone = await DaemonProcess.eventually {
                (try? await database.value("SELECT string_agg(state, ',') FROM daily_units WHERE version = 2"))
                    == "done"
            }
            try #require(dailyDone, "\(daemon.log.suffix(2000))")
            #expect(try await daemon.request("/v1/admin/recompute", method: .post).status == .unauthorized)
            #expect(
                try await daemon.request(
                    "/v1/admin/recompute", method: .post, headers: TestTokens.bearer("wrong-admin-token-123456")
                ).status == .unauthorized)
            #expect(
                try await daemon.request(
                    "/v1/admin/recompute", method: .post, headers: TestTokens.bearer(TestTokens.user(1))
                ).status == .unauthorized)

            // Trigger and wait on the command line; `date` stamps the instant it returned.
            let cli = ["DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2"]
            let run = try await Self.runStamped(["recompute-all", "--wait"], environment: cli)
            #expect(run.status == 0, "\(run.output)")
            #expect(run.output.contains("recompute job 1 created for formula version 2 (2000 users)"), "\(run.output)")
            let summary = "2000 users examined, 1862 written, 98 already current, 40 skipped"
            #expect(run.output.contains("recompute job 1 done: \(summary)"), "\(run.output)")
            let times = try await database.value(
                "SELECT extract(epoch FROM finished_at) || ' ' || extract(epoch FROM started_at) FROM recompute_jobs WHERE id = 1"
            )
            let seconds = (times ?? "").split(separator: " ").compactMap { Double($0) }
            try #require(seconds.count == 2, "finished_at and started_at of job 1: \(String(describing: times))")
            let (finishedAt, started) = (seconds[0], seconds[1])
            #expect(finishedAt - started > 0.3, "the job ran long enough for the CLI to be waiting")
            let latency = run.returnedAt - finishedAt
            #expect(
                latency > -0.01 && latency < 0.2,
                "recompute-all --wait returned \(latency) s after the job's finished_at")

            // The same counts in the API document, the log and /metrics.
            let admin = TestTokens.bearer(DaemonProcess.secrets.adminToken)
            let progress = try await daemon.request("/v1/admin/recompute/1", headers: admin)
            let job = try #require(try progress.json()["data"] as? [String: Any])["job"] as? [String: Any]
            #expect(job?["state"] as? String == "done")
            #expect(job?["percent"] as? Double == 100)
            #expect(job?["usersTotal"] as? Int == 2000)
            #expect(job?["usersExamined"] as? Int == 2000)
            #expect(job?["usersWritten"] as? Int == 1862)
            #expect(job?["usersAlreadyCurrent"] as? Int == 98)
            #expect(job?["usersSkipped"] as? Int == 40)
            let logged = await DaemonProcess.eventually(timeout: .seconds(5)) {
                daemon.log.contains("Recompute job 1 done: \(summary)")
            }
            #expect(logged, "\(daemon.log.suffix(2000))")
            let scraped = try await PrometheusScrape.scrape(daemon)
            let recompute = ["kind": "recompute"]
            #expect(PrometheusScrape.value(scraped, "metricsd_users_examined_total", recompute) == 2000)
            #expect(PrometheusScrape.value(scraped, "metricsd_users_written_total", recompute) == 1862)
            #expect(PrometheusScrape.value(scraped, "metricsd_users_already_current_total", recompute) == 98)
            #expect(PrometheusScrape.value(scraped, "metricsd_users_skipped_total", recompute) == 40)

            // A second trigger, over HTTP and on the command line: nothing to do, no job.
            let again = try await daemon.request("/v1/admin/recompute", method: .post, headers: admin)
            #expect(again.status == .ok)
            #expect(again.headers[.location] == "/v1/admin/recompute/1")
            let data = try #require(try again.json()["data"] as? [String: Any])
            #expect(data["created"] as? Bool == false)
            #expect(data["nothingToDo"] as? Bool == true)
            #expect((data["job"] as? [String: Any])?["id"] as? Int == 1)
            #expect((data["message"] as? String)?.hasPrefix("nothing to do") == true, "\(data)")
            let second = try DaemonProcess(arguments: ["recompute-all", "--wait"], environment: cli)
            #expect(await second.waitForExit() == 0, "\(second.log)")
            #expect(
                second.log.hasPrefix("nothing to do: every user already has a formula version 2 row"), "\(second.log)")
            #expect(second.log.contains("latest job 1 done: \(summary)"), "\(second.log)")
            #expect(try await database.value("SELECT count(*) FROM recompute_jobs") == "1")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// Runs `metricsd ARGUMENTS` under `sh`, which prints the wall-clock instant it returned (`date +%s.%N`) after
    /// its output: the instant is measured on the machine's clock, the one PostgreSQL's `now()` reads too.
    static func runStamped(_ arguments: [String], environment: [String: String]) async throws
        -> (status: Int32, output: String, returnedAt: Double)
    {
        let binary = try DaemonProcess.binary()
        return try await Task.detached {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", #""$0" "$@"; status=$?; date +%s.%N; exit $status"#, binary] + arguments
            var environment = environment
            environment["PATH"] = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
            process.environment = environment
            let pipe = Pipe()
            process.standardOutput = pipe
            process.standardError = pipe
            try process.run()
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            let output = String(decoding: data, as: UTF8.self)
            let stamp = output.split(separator: "\n").last.flatMap { Double($0) }
            return (process.terminationStatus, output, try #require(stamp, "no timestamp in: \(output)"))
        }.value
    }
}
