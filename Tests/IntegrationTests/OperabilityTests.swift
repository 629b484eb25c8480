import Foundation
import HTTPTypes
import HealthMetrics
import HummingbirdTesting
import MetricsdPostgres
import MetricsdTestSupport
import MetricsdWork
import Testing

/// `/metrics` and `metricsd status`: what an operator sees at 00:30.
@Suite struct OperabilityTests {
    /// `promtool check metrics` (Debian's `prometheus` package) on `text`: its exit status and output.
    static func promtool(_ text: String) throws -> (status: Int32, output: String) {
        let path = "/usr/bin/promtool"
        try #require(
            FileManager.default.isExecutableFile(atPath: path),
            "promtool is missing: install Debian's prometheus package (scripts/test does)")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = ["check", "metrics"]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = output
        try process.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    /// A starting instance makes the history's partitions of the months ahead that are missing, and says so in its
    /// log. (The empty test database's partitions are laid out again so that the months from the current one on
    /// have none.)
    @Test func aStartingInstanceAddsTheMonthsAhead() async throws {
        try await withTestDatabase { database in
            let month = try #require(try await database.value("SELECT date_trunc('month', now())::date"))
            try await database.execute(
                """
                DO $$
                DECLARE p regclass;
                BEGIN
                  FOR p IN SELECT i.inhrelid::regclass FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                           WHERE i.inhparent = 'profile_metrics'::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
                  LOOP
                    EXECUTE format('DROP TABLE %s', p);
                  END LOOP;
                END $$;
                CREATE TABLE profile_metrics_until_test (LIKE profile_metrics INCLUDING DEFAULTS);
                ALTER TABLE profile_metrics ATTACH PARTITION profile_metrics_until_test FOR VALUES FROM (MINVALUE) TO ('\(month)');
                """)
            let monthly = """
                SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'profile_metrics'::regclass AND c.relname ~ '^profile_metrics_[0-9]{4}_[0-9]{2}$'
                """
            #expect(try await database.value(monthly) == "0")
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port, extra: ["METRICSD_WORKERS": "0"]),
                port: port)
            try await daemon.waitUntilReady()
            // The current month and the two after it, at least (a third after it when two months from now is
            // already in it).
            let added = await DaemonProcess.eventually(timeout: .seconds(10)) {
                Int((try? await database.value(monthly)) ?? "0") ?? 0 >= 3
            }
            #expect(added, "\(daemon.log.suffix(2000))")
            let logged = await DaemonProcess.eventually(timeout: .seconds(5)) {
                daemon.log.contains("Added monthly partitions of profile_metrics")
            }
            #expect(logged, "\(daemon.log.suffix(2000))")
            #expect(
                try await database.value(
                    "SELECT count(*) FROM profile_metrics_\(month.prefix(7).replacingOccurrences(of: "-", with: "_"))")
                    == "0")
        }
    }

    /// An upgraded install's history, moved by the daemons: `metricsd status` says how far the move is; an instance
    /// with METRICSD_HISTORY_MOVE=off leaves it (and /metrics shows it waiting: active, nothing copied); an instance
    /// at the default moves it to the end and says so in its log, and /metrics and `metricsd status` say it is done.
    @Test func theDaemonMovesAnUpgradedHistory() async throws {
        try await withTestDatabase(try await TestDatabase.upgradedInstall(users: 30, days: 100)) { database in
            _ = try await database.migrate()
            let source = try #require(try await database.value("SELECT source FROM history_move"))
            let months = try #require(try await database.value("SELECT count(*) FROM history_move_months"))
            let before = try DaemonProcess(arguments: ["status"], environment: ["DATABASE_URL": database.url])
            #expect(await before.waitForExit() == 0)
            #expect(
                before.log.contains(
                    "history move: copying \(source) into monthly partitions: 0 of \(months) months, 0 of ~3000 rows (0.0%)"
                ),
                "\(before.log)")
            let settings = ["METRICSD_TICK_SECONDS": "0.2"]

            var port = DaemonProcess.freePort()
            let off = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port,
                    extra: settings.merging(["METRICSD_HISTORY_MOVE": "off"]) { $1 }),
                port: port)
            try await off.waitUntilReady()
            var scraped: [String: Double] = [:]
            let waiting = await DaemonProcess.eventually(timeout: .seconds(10)) {
                scraped = (try? await PrometheusScrape.scrape(off)) ?? [:]
                return PrometheusScrape.value(scraped, "metricsd_history_move_active") == 1
            }
            #expect(waiting, "\(scraped)")
            #expect(PrometheusScrape.value(scraped, "metricsd_history_move_rows", ["state": "estimated"]) == 3000)
            #expect(PrometheusScrape.value(scraped, "metricsd_history_move_rows", ["state": "copied"]) == 0)
            #expect(PrometheusScrape.value(scraped, "metricsd_history_move_writes_pending") == 0)
            #expect(try await database.value("SELECT state FROM history_move") == "copying")
            off.signal(SIGTERM)
            #expect(await off.waitForExit() == 0)

            port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: port, extra: settings),
                port: port)
            try await daemon.waitUntilReady()
            // Done, and a tick after it the gauges say so (they read 0 before the first tick).
            let moved = await DaemonProcess.eventually(timeout: .seconds(60)) {
                scraped = (try? await PrometheusScrape.scrape(daemon)) ?? [:]
                return PrometheusScrape.value(scraped, "metricsd_history_move_rows", ["state": "copied"]) == 3000
                    && PrometheusScrape.value(scraped, "metricsd_history_move_active") == 0
            }
            #expect(moved, "\(scraped)\n\(daemon.log.suffix(3000))")
            #expect(try await database.value("SELECT state FROM history_move") == "done")
            #expect(daemon.log.contains("History moved into monthly partitions"), "\(daemon.log.suffix(3000))")
            #expect(PrometheusScrape.undocumentedFamilies(try await PrometheusScrape.scrapeText(daemon)) == [])
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)

            let after = try DaemonProcess(arguments: ["status", "--json"], environment: ["DATABASE_URL": database.url])
            #expect(await after.waitForExit() == 0)
            let json = try #require(
                try JSONSerialization.jsonObject(with: Data(after.log.utf8)) as? [String: Any], "\(after.log)")
            let move = try #require(json["historyMove"] as? [String: Any], "\(json)")
            #expect(move["state"] as? String == "done")
            #expect(move["rowsCopied"] as? Int == 3000)
            #expect(move["source"] as? String == source)
            #expect((move["swapLockMilliseconds"] as? Double ?? -1) >= 0, "\(move)")
        }
    }

    /// A stop while the history move builds a month's index (here waiting on a transaction that holds the month's
    /// table) does not wait for the build: the build is cancelled on the server and the daemon exits at once,
    /// cleanly; the month is indexed later.
    @Test func aStopDoesNotWaitForTheHistoryMovesIndexBuild() async throws {
        try await withTestDatabase(try await TestDatabase.upgradedInstall(users: 20, days: 40)) { database in
            _ = try await database.migrate()
            let queue = WorkQueue(pool: database.pool, formula: .current, owner: "test", logger: database.logger)
            while try await database.value("SELECT state FROM history_move") == "copying" {
                _ = try await queue.moveHistory(batchRows: 1000)
            }
            let month = try #require(
                try await database.value("SELECT partition FROM history_move_months ORDER BY month LIMIT 1"))
            let blocker = PostgresPool(
                settings: try ConnectionSettings(conninfo: database.url, environment: [:]),
                configuration: .init(size: 1),
                logger: database.logger)
            try await blocker.withConnection { try $0.execute("BEGIN; LOCK TABLE \(month) IN ROW EXCLUSIVE MODE") }
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: port), port: port)
            try await daemon.waitUntilReady()
            let building = await DaemonProcess.eventually(timeout: .seconds(20)) {
                (try? await database.value(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE UNIQUE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'"
                ))
                    == "1"
            }
            #expect(building, "\(daemon.log.suffix(2000))")
            let stopped = ContinuousClock.now
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit(timeout: .seconds(15)) == 0, "\(daemon.log.suffix(2000))")
            #expect(ContinuousClock.now - stopped < .seconds(10))
            #expect(!daemon.log.contains("History move step failed"), "\(daemon.log.suffix(2000))")
            try await blocker.withConnection { try $0.execute("ROLLBACK") }
            await blocker.close()
            #expect(
                try await database.value(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE %INDEX CONCURRENTLY%' AND state = 'active'"
                ) == "0")
        }
    }

    @Test func metricsFollowTheWork() async throws {
        try await withTestDatabase { database in
            var users = (1...300).map { SeedUser.valid(Int64($0), timezone: "UTC") }
            for index in stride(from: 0, to: 300, by: 60) { users[index].height = "72.0" }
            try await database.seed(users)
            // Onboarded long ago: only the daily unit computes them.
            try await database.execute(
                "SET session_replication_role = replica; UPDATE user_settings SET updated_at = now() - interval '1 day'; SET session_replication_role = DEFAULT"
            )
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port, extra: ["METRICSD_DAILY_AT": "00:00"]),
                port: port)
            try await daemon.waitUntilReady()
            let unitDone = await DaemonProcess.eventually {
                (try? await database.value("SELECT state FROM daily_units")) == "done"
            }
            #expect(unitDone)
            var scraped = try await PrometheusScrape.scrape(daemon)
            // The counters are recorded right after the chunk commits; allow the worker to get there.
            _ = await DaemonProcess.eventually(timeout: .seconds(5)) {
                scraped = (try? await PrometheusScrape.scrape(daemon)) ?? scraped
                // (The gauges follow at the next tick.)
                return PrometheusScrape.value(scraped, "metricsd_daily_units_completed_total") == 1
                    && PrometheusScrape.value(scraped, "metricsd_daily_users_waiting") == 0
            }
            #expect(PrometheusScrape.value(scraped, "metricsd_users_examined_total", ["kind": "daily"]) == 300)
            #expect(PrometheusScrape.value(scraped, "metricsd_users_written_total", ["kind": "daily"]) == 295)
            #expect(PrometheusScrape.value(scraped, "metricsd_users_already_current_total", ["kind": "daily"]) == 0)
            #expect(PrometheusScrape.value(scraped, "metricsd_users_skipped_total", ["kind": "daily"]) == 5)
            #expect(
                PrometheusScrape.value(
                    scraped, "metricsd_skip_reasons_total", ["kind": "daily", "reason": "out_of_range"]) == 5)
            #expect(PrometheusScrape.value(scraped, "metricsd_daily_users_waiting") == 0)
            #expect(PrometheusScrape.value(scraped, "metricsd_work_leases_taken_over_total", ["kind": "daily"]) == 0)
            // The unit fell due at 00:00 UTC today; it ended now: its delay is the time since midnight.
            let sinceMidnight = Date().timeIntervalSince1970.truncatingRemainder(dividingBy: 86_400)
            let delaySum = try #require(PrometheusScrape.value(scraped, "metricsd_daily_unit_delay_seconds_sum"))
            #expect(PrometheusScrape.value(scraped, "metricsd_daily_unit_delay_seconds_count") == 1)
            #expect(
                delaySum > sinceMidnight - 120 && delaySum <= sinceMidnight + 1,
                "delay \(delaySum) s, midnight \(sinceMidnight) s ago")
            #expect(PrometheusScrape.value(scraped, "metricsd_daily_units_completed_total") == 1)
            // Each row written is one observation of its lateness, under the zone's UTC offset: 295 rows of UTC
            // users, each committed about the time since midnight after its due instant.
            let lateness = ["utc_offset": "+00:00"]
            #expect(PrometheusScrape.value(scraped, "metricsd_daily_lateness_seconds_count", lateness) == 295)
            let latenessSum = try #require(
                PrometheusScrape.value(scraped, "metricsd_daily_lateness_seconds_sum", lateness))
            #expect(
                latenessSum > 295 * (sinceMidnight - 120) && latenessSum <= 295 * (sinceMidnight + 1),
                "lateness \(latenessSum / 295) s per row, midnight \(sinceMidnight) s ago")
            #expect(
                !scraped.keys.contains { $0.hasPrefix("metricsd_daily_lateness_seconds") && $0.contains("unknown") })
            #expect(PrometheusScrape.value(scraped, "metricsd_build_info", ["formula_version": "1"]) == 1)
            #expect(PrometheusScrape.value(scraped, "metricsd_db_pool_connections", ["state": "open"]) != nil)
            #expect(PrometheusScrape.value(scraped, "metricsd_daily_oldest_overdue_unit_age_seconds") != nil)
            #expect(scraped.keys.contains { $0.hasPrefix("metricsd_daily_unit_duration_seconds_bucket") })

            // HTTP requests by route and status, and the latency histogram.
            let before =
                PrometheusScrape.value(scraped, "metricsd_http_requests_total", ["route": "/healthz", "status": "200"])
                ?? 0
            for _ in 0..<3 { _ = try await daemon.request("/healthz") }
            _ = try await daemon.request("/v1/profile/metrics/today")
            scraped = try await PrometheusScrape.scrape(daemon)
            #expect(
                PrometheusScrape.value(scraped, "metricsd_http_requests_total", ["route": "/healthz", "status": "200"])
                    == before + 3)
            #expect(
                PrometheusScrape.value(
                    scraped, "metricsd_http_requests_total", ["route": "/v1/profile/metrics/today", "status": "401"])
                    == 1)
            #expect(
                scraped.keys.contains {
                    $0.hasPrefix("metricsd_http_request_duration_seconds_bucket") && $0.contains("/healthz")
                })

            // A recompute of the same version after the daily unit: every user is current, so no job.
            let admin = TestTokens.bearer(DaemonProcess.secrets.adminToken)
            let trigger = try await daemon.request("/v1/admin/recompute", method: .post, headers: admin)
            #expect(trigger.status == .ok)
            let data = try #require(try trigger.json()["data"] as? [String: Any])
            #expect(data["nothingToDo"] as? Bool == true, "\(data)")
            #expect(data["job"] is NSNull, "\(data)")
            #expect(try await database.value("SELECT count(*) FROM recompute_jobs") == "0")

            // By convention: HELP and TYPE for every family, and promtool finds nothing to say.
            let text = try await PrometheusScrape.scrapeText(daemon)
            #expect(PrometheusScrape.undocumentedFamilies(text) == [])
            let lint = try Self.promtool(text)
            #expect(
                lint.status == 0 && lint.output.isEmpty, "promtool check metrics (exit \(lint.status)):\n\(lint.output)"
            )
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    /// `metricsd status --json` on a database prepared with done, running, overdue and skipped work and two
    /// instance heartbeats.
    @Test func statusJSON() async throws {
        try await withTestDatabase { database in
            // Three zones whose daily time (00:05) passed more than an hour ago, right now.
            let zones = try await database.rows(
                """
                SELECT name FROM pg_timezone_names
                WHERE name IN ('UTC', 'Asia/Tokyo', 'America/New_York', 'Europe/Berlin', 'Asia/Kolkata', 'Pacific/Auckland',
                               'America/Los_Angeles', 'Australia/Sydney', 'Asia/Dubai', 'America/Sao_Paulo')
                  AND (now() AT TIME ZONE name)::time > time '01:10'
                ORDER BY name LIMIT 3
                """
            ).compactMap { $0.first ?? nil }
            try #require(zones.count == 3, "need three zones past 01:10 local time")
            let (done, running, overdue) = (zones[0], zones[1], zones[2])
            var users: [SeedUser] = []
            for (index, zone) in zones.enumerated() {
                users += (1...10).map { SeedUser.valid(Int64(index * 10 + $0), timezone: zone) }
            }
            users[0].gender = "robot"
            try await database.seed(users)
            try await database.execute(
                """
                INSERT INTO daily_units (timezone, local_date, version, timezone_known, state, users_total, created_at, started_at, finished_at)
                VALUES ('\(done)', (now() AT TIME ZONE '\(done)')::date, 1, true, 'done', 10, now() - interval '50 minutes',
                        now() - interval '50 minutes', now() - interval '49 minutes'),
                       ('\(running)', (now() AT TIME ZONE '\(running)')::date, 1, true, 'running', 10, now() - interval '2 minutes',
                        now() - interval '2 minutes', NULL);
                INSERT INTO work_chunks (kind, priority, timezone, local_date, version, range_start, range_end, cursor_user_id,
                                         state, lease_owner, lease_until, attempts, users_done, users_skipped, created_at, finished_at)
                VALUES ('daily', 0, '\(done)', (now() AT TIME ZONE '\(done)')::date, 1, 0, 9223372036854775807, 9223372036854775807,
                        'done', 'host-a:1:aa', now() - interval '49 minutes', 1, 9, 1, now(), now()),
                       ('daily', 0, '\(running)', (now() AT TIME ZONE '\(running)')::date, 1, 0, 9223372036854775807, 15,
                        'running', 'host-b:2:bb', now() + interval '1 minute', 1, 5, 0, now(), NULL);
                INSERT INTO metrics_skips (user_id, reason_codes, reasons, metrics_date, version, source, recorded_at)
                VALUES (1, '{unknown_gender}', 'gender ''robot'' is not one of male, female, other', current_date, 1, 'daily', now());
                INSERT INTO metricsd_instances (instance_id, host, pid, build_version, formula_version, listen, started_at, last_seen_at)
                VALUES ('host-a:1:aa', 'host-a', 1, '1.0.0', 1, '127.0.0.1:8080', now() - interval '1 hour', now()),
                       ('host-b:2:bb', 'host-b', 2, '1.0.0', 1, '127.0.0.1:8080', now() - interval '1 hour', now() - interval '5 seconds'),
                       ('host-c:3:cc', 'host-c', 3, '0.9.0', 1, '127.0.0.1:8080', now() - interval '3 hours', now() - interval '2 hours');
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date)
                SELECT id, 22.0, 1500, 2000, 1, current_date FROM users WHERE id BETWEEN 2 AND 10;
                """)
            let status = try DaemonProcess(
                arguments: ["status", "--json"], environment: ["DATABASE_URL": database.url])
            #expect(await status.waitForExit() == 0, "\(status.log)")
            let json = try #require(
                try JSONSerialization.jsonObject(with: Data(status.log.utf8)) as? [String: Any], "\(status.log)")
            #expect((json["schema"] as? [String: Any])?["current"] as? Bool == true)
            let instances = try #require(json["instances"] as? [[String: Any]])
            #expect(
                instances.filter { $0["alive"] as? Bool == true }.compactMap { $0["id"] as? String }.sorted() == [
                    "host-a:1:aa", "host-b:2:bb",
                ])
            let zoneStates = Dictionary(
                uniqueKeysWithValues: try #require(json["zones"] as? [[String: Any]]).map {
                    ($0["timezone"] as? String ?? "", $0)
                })
            #expect(zoneStates[done]?["state"] as? String == "done")
            #expect(zoneStates[running]?["state"] as? String == "running")
            #expect(zoneStates[running]?["runningBy"] as? [String] == ["host-b:2:bb"])
            #expect(zoneStates[overdue]?["state"] as? String == "overdue")
            #expect((zoneStates[overdue]?["overdueSeconds"] as? Double ?? 0) > 3600)
            let units = try #require(json["units"] as? [String: Any])
            #expect(units["done"] as? Int == 1)
            #expect(units["running"] as? Int == 1)
            #expect(units["overdue"] as? Int == 1)
            let skipped = try #require(json["skippedByReason"] as? [[String: Any]])
            #expect(skipped.count == 1)
            #expect(skipped.first?["reason"] as? String == "unknown_gender")
            #expect(skipped.first?["users"] as? Int == 1)
            let versions = try #require(json["usersByFormulaVersion"] as? [[String: Any]])
            #expect(versions.count == 2)
            #expect(versions.first { $0["version"] as? Int == 1 }?["users"] as? Int == 9)
            #expect(versions.first { $0["version"] is NSNull }?["users"] as? Int == 21)
            // Retention is off unless set: nothing ran, nothing is behind.
            let retention = try #require(json["retention"] as? [String: Any], "\(json)")
            #expect(retention["days"] as? Int == 0)
            #expect(retention["behindSeconds"] is NSNull && retention["latestRun"] is NSNull, "\(retention)")
            // No instance reads from standbys here.
            #expect((json["readServers"] as? [Any])?.isEmpty == true, "\(json)")

            let text = try DaemonProcess(arguments: ["status"], environment: ["DATABASE_URL": database.url])
            #expect(await text.waitForExit() == 0)
            for expected in [
                "instances: 2 alive", "daily units (3 zones): done 1, running 1, pending 0, overdue 1", "OVERDUE",
                "unknown_gender", "v1 (current)",
                "retention: off (METRICSD_RETENTION_DAYS=0: every row is kept)",
                "read servers: none (every latest read goes to DATABASE_URL",
            ] {
                #expect(text.log.contains(expected), "status output lacks '\(expected)':\n\(text.log)")
            }
        }
    }

    /// With METRICSD_RETENTION_DAYS=30 the daemon removes the rows the setting asks for in the background and says
    /// so on /metrics, in its log and in `metricsd status`; each user's newest row stays, however old.
    @Test func retentionRunsInTheDaemon() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...20).map { SeedUser.valid(Int64($0), timezone: "UTC") })
            // Users 1-10: rows computed 100, 50 and 10 days ago (the first two go); users 11-20: one row computed
            // 100 days ago, their newest until today's daily unit, and then a newer row under three days old: it stays.
            try await database.execute(
                """
                INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
                SELECT u, 22.0, 1500, 2000, 1, (now() - make_interval(days => d))::date, now() - make_interval(days => d)
                FROM generate_series(1, 10) u CROSS JOIN (VALUES (100), (50), (10)) AS ages(d)
                UNION ALL
                SELECT u, 22.0, 1500, 2000, 1, (now() - interval '100 days')::date, now() - interval '100 days'
                FROM generate_series(11, 20) u
                """)
            let port = DaemonProcess.freePort()
            let environment = DaemonProcess.environment(
                databaseURL: database.url, port: port, extra: ["METRICSD_RETENTION_DAYS": "30"])
            let daemon = try DaemonProcess(environment: environment, port: port)
            try await daemon.waitUntilReady()
            let ran = await DaemonProcess.eventually {
                (try? await database.value("SELECT count(*) FROM retention_runs WHERE state = 'done'")) == "1"
            }
            #expect(ran, "\(daemon.log)")
            let old =
                "SELECT user_id, (now() - computed_at) > interval '60 days' FROM profile_metrics WHERE computed_at < now() - interval '30 days' ORDER BY user_id"
            let kept = try await database.rows(old)
            #expect(kept.map { $0[0] } == (11...20).map { "\($0)" }, "rows older than 30 days left: \(kept)")
            #expect(
                try await database.value(
                    "SELECT count(*) FROM profile_metrics WHERE user_id <= 10 AND computed_at < now() - interval '9 days'"
                ) == "10")

            var scraped: [String: Double] = [:]
            let reported = await DaemonProcess.eventually(timeout: .seconds(10)) {
                scraped = (try? await PrometheusScrape.scrape(daemon)) ?? scraped
                return PrometheusScrape.value(scraped, "metricsd_retention_runs_completed_total") == 1
                    && (PrometheusScrape.value(scraped, "metricsd_retention_behind_seconds") ?? .infinity) < 600
            }
            #expect(reported, "\(scraped.filter { $0.key.contains("retention") })")
            #expect(PrometheusScrape.value(scraped, "metricsd_retention_rows_removed_total") == 20)
            #expect(PrometheusScrape.value(scraped, "metricsd_work_failures_total", ["kind": "retention"]) == nil)
            #expect(daemon.log.contains("Retention run done: 20 rows removed"), "\(daemon.log)")

            let status = try DaemonProcess(arguments: ["status", "--json"], environment: environment)
            #expect(await status.waitForExit() == 0, "\(status.log)")
            let json = try #require(
                try JSONSerialization.jsonObject(with: Data(status.log.utf8)) as? [String: Any], "\(status.log)")
            let retention = try #require(json["retention"] as? [String: Any], "\(json)")
            #expect(retention["days"] as? Int == 30)
            #expect((retention["behindSeconds"] as? Double ?? .infinity) < 600, "\(retention)")
            let run = try #require(retention["latestRun"] as? [String: Any], "\(retention)")
            #expect(
                run["state"] as? String == "done" && run["rowsRemoved"] as? Int == 20
                    && run["fullPass"] as? Bool == true, "\(run)")
            let text = try DaemonProcess(arguments: ["status"], environment: environment)
            #expect(await text.waitForExit() == 0)
            #expect(text.log.contains("retention: rows older than 30 days are removed; caught up"), "\(text.log)")
            #expect(text.log.contains("20 rows removed"), "\(text.log)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
