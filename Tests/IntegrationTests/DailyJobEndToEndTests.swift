import Foundation
import HealthMetrics
import MetricsdPostgres
import MetricsdTestSupport
import Testing

/// The daily job through the real `metricsd serve` binary.
@Suite struct DailyJobEndToEndTests {
    /// Two instances, one database, 20,000 users over every zone PostgreSQL knows, and a daily time a minute or
    /// two ahead of UTC (of UTC+1 late in UTC's day): zones already past it catch up at start; zones at that offset
    /// get nothing until it passes, then exactly one row per user; no user ever gets two rows for one date and
    /// version.
    @Test func twoInstancesTwentyThousandUsersAllZones() async throws {
        try await withTestDatabase(poolSize: 2) { database in
            // Users who onboarded yesterday (the trigger would stamp their settings "just changed" and have them
            // computed at once, as onboarding should).
            try await database.execute(
                """
                SET session_replication_role = replica;
                WITH zones AS (
                  SELECT array_agg(name ORDER BY name) AS names FROM pg_timezone_names
                  WHERE name NOT LIKE 'posix/%' AND name NOT LIKE 'right/%'
                )
                INSERT INTO users (id, timezone)
                SELECT g, names[1 + (g % array_length(names, 1))] FROM generate_series(1, 20000) g, zones;
                INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level,
                                           onboarding_completed)
                SELECT id, date '1990-01-01' + (id % 5000)::int, (ARRAY['male','female','other'])[1 + id % 3],
                       50 + (id % 100), 150 + (id % 50), 'sedentary', true FROM users;
                UPDATE user_settings SET updated_at = now() - interval '1 day';
                SET session_replication_role = DEFAULT;
                ANALYZE users;
                """)
            // The zones that wait: those at UTC+0, or at UTC+1 when UTC's day ends within 15 minutes. The daily time,
            // 2–3 minutes ahead of their local time, must not fall after their midnight (at 23:58, 00:01 is a daily
            // time their day has passed already), and their rows are counted by their local date, which must not
            // change while the test runs.
            let now = Date()
            let offset = Int(now.timeIntervalSince1970) % 86_400 < 86_400 - 15 * 60 ? 0 : 3600
            let zoneOffset = "\(offset) seconds"
            // The daily time, at that offset: two minutes after the next minute boundary (`date(bySetting:)` moves
            // forward to the next second 0), so 2–3 minutes from now.
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = TimeZone(secondsFromGMT: offset)!
            let due = calendar.date(
                byAdding: .minute, value: 2, to: calendar.date(bySetting: .second, value: 0, of: now)!)!
            let parts = calendar.dateComponents([.hour, .minute], from: due)
            let dailyAt = String(format: "%02d:%02d", parts.hour!, parts.minute!)
            // Zones at that offset now and in 15 minutes (none whose clocks change meanwhile): not due until
            // `dailyAt`; their users are checked for "none before, one after".
            let waitingZones = try #require(
                try await database.value(
                    """
                    SELECT array_agg(name ORDER BY name)::text FROM pg_timezone_names
                    WHERE utc_offset = $1::interval
                      AND (now() + interval '15 minutes') AT TIME ZONE name
                          = ((now() + interval '15 minutes') AT TIME ZONE 'UTC') + $1::interval
                    """, [zoneOffset]))
            let waitingZoneUsers = try await database.value(
                "SELECT count(*) FROM users WHERE timezone = ANY($1::text[])", [waitingZones])
            let waiting = Int(waitingZoneUsers ?? "0") ?? 0
            #expect(waiting > 100)

            let portA = DaemonProcess.freePort()
            let portB = DaemonProcess.freePort()
            let extra = ["METRICSD_DAILY_AT": dailyAt, "METRICSD_CHUNK_SIZE": "500", "METRICSD_WORKERS": "2"]
            let a = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: portA, extra: extra),
                port: portA)
            let b = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: portB, extra: extra),
                port: portB)
            try await a.waitUntilReady()
            try await b.waitUntilReady()

            // Catch-up: every zone whose local time is past the daily time gets its current date's rows.
            let caughtUp = await DaemonProcess.eventually(timeout: .seconds(90)) {
                let pending = try? await database.value(
                    """
                    SELECT count(*) FROM users u JOIN pg_timezone_names z ON z.name = u.timezone
                    WHERE (now() AT TIME ZONE u.timezone)::time >= $1::time
                      AND NOT EXISTS (SELECT 1 FROM profile_metrics pm WHERE pm.user_id = u.id
                                      AND pm.metrics_date = (now() AT TIME ZONE u.timezone)::date)
                    """, [dailyAt])
                return pending == "0"
            }
            #expect(caughtUp, "zones past \(dailyAt) were not caught up")
            if Date() < due.addingTimeInterval(-2) {
                let early = try await database.value(
                    """
                    SELECT count(*) FROM profile_metrics pm JOIN users u ON u.id = pm.user_id
                    WHERE u.timezone = ANY($1::text[]) AND pm.metrics_date = (now() AT TIME ZONE u.timezone)::date
                    """, [waitingZones])
                #expect(early == "0", "UTC+\(offset / 3600) zones got rows before \(dailyAt)")
            }

            // After the daily time: the waiting zones' users each get exactly one row for today. The wait is counted
            // from the daily time itself (it is 2–3 minutes away, whatever the catch-up took).
            let untilDue = Duration.milliseconds(Int64(max(0, due.timeIntervalSinceNow) * 1000))
            let done = await DaemonProcess.eventually(timeout: untilDue + .seconds(90)) {
                guard Date() > due else { return false }
                let count = try? await database.value(
                    """
                    SELECT count(*) FROM profile_metrics pm JOIN users u ON u.id = pm.user_id
                    WHERE u.timezone = ANY($1::text[]) AND pm.metrics_date = (now() AT TIME ZONE u.timezone)::date
                    """, [waitingZones])
                return count == String(waiting)
            }
            #expect(
                done, "UTC+\(offset / 3600) zones did not get their rows after \(dailyAt); logs:\n\(a.log.suffix(2000))"
            )
            let first = try await database.value(
                """
                SELECT min(pm.computed_at) >= $1::timestamptz FROM profile_metrics pm JOIN users u ON u.id = pm.user_id
                WHERE u.timezone = ANY($2::text[]) AND pm.metrics_date = (now() AT TIME ZONE u.timezone)::date
                """, [ISO8601DateFormatter().string(from: due), waitingZones])
            #expect(first == "t", "a UTC+\(offset / 3600) row was computed before \(dailyAt)")
            #expect(
                try await database.value(
                    "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                ) == "0")
            #expect(
                try await database.value(
                    "SELECT count(DISTINCT lease_owner) FROM work_chunks WHERE state = 'done'") == "2",
                "both instances worked")
            a.signal(SIGTERM)
            b.signal(SIGTERM)
            #expect(await a.waitForExit() == 0)
            #expect(await b.waitForExit() == 0)
        }
    }

    /// Onboarding or a profile edit recomputes the user's current row within seconds (trigger + LISTEN/NOTIFY),
    /// moving `computed_at` forward; and a user with bad settings is listed by `metricsd skipped` with the reason.
    @Test func settingsChangeIsRecomputedWithinFiveSeconds() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(1, timezone: "Asia/Kathmandu"), SeedUser.valid(2)])
            // Only the settings listener writes: the daily units count as done already. (Otherwise, between a zone's
            // midnight and its daily time, the daemon's due unit would be the previous date's, and give user 1 a
            // second row beside the listener's row for today.)
            try await database.execute(
                """
                INSERT INTO daily_units (timezone, local_date, version, timezone_known, state, users_total, created_at)
                SELECT DISTINCT timezone, date '2999-12-31', 1, true, 'done', 0, now() FROM users
                """)
            let port = DaemonProcess.freePort()
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(
                    databaseURL: database.url, port: port, extra: ["METRICSD_WORKERS": "1"]),
                port: port)
            try await daemon.waitUntilReady()
            let computed = await DaemonProcess.eventually(timeout: .seconds(20)) {
                (try? await database.value("SELECT count(*) FROM profile_metrics WHERE user_id = 1")) == "1"
            }
            #expect(computed)
            let before = try #require(
                try await database.rows("SELECT bmi::text, computed_at::text FROM profile_metrics WHERE user_id = 1")
                    .first)

            let changed = ContinuousClock.now
            try await database.execute("UPDATE user_settings SET current_weight = 95.00 WHERE user_id = 1")
            let refreshed = await DaemonProcess.eventually(timeout: .seconds(5)) {
                let row = try? await database.rows(
                    "SELECT bmi::text, computed_at::text FROM profile_metrics WHERE user_id = 1"
                ).first
                return row != nil && row! != before
            }
            let elapsed = ContinuousClock.now - changed
            #expect(refreshed, "not recomputed within 5 s")
            #expect(elapsed < .seconds(5))
            #expect(
                try await database.value("SELECT count(*) FROM profile_metrics WHERE user_id = 1") == "1",
                "updated in place")
            #expect(
                try await database.value(
                    "SELECT computed_at > $1::timestamptz FROM profile_metrics WHERE user_id = 1", [before[1]]) == "t")

            try await database.execute("UPDATE user_settings SET height = 72.0 WHERE user_id = 2")
            let listed = await DaemonProcess.eventually(timeout: .seconds(5)) {
                (try? await database.value("SELECT reasons FROM metrics_skips WHERE user_id = 2"))
                    == "height 72 cm is outside 100–250 cm"
            }
            #expect(listed)
            let cli = try DaemonProcess(
                arguments: ["skipped", "--limit", "10"], environment: ["DATABASE_URL": database.url])
            #expect(await cli.waitForExit() == 0)
            #expect(cli.log.contains("height 72 cm is outside 100–250 cm"), "metricsd skipped printed:\n\(cli.log)")
            #expect(cli.log.contains("out_of_range"))
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
