import Foundation
import HealthMetrics
import MetricsdPostgres
import MetricsdReads
import MetricsdTestSupport
import MetricsdWork
import Testing

/// The calendar's hardest days, on the database's clock and tz rules with an injected "now": a local date that
/// never existed, and a user who changes time zone.
@Suite struct CalendarTests {
    static func queue(_ database: TestDatabase) -> WorkQueue {
        WorkQueue(pool: database.pool, formula: .current, owner: "w1", logger: database.logger)
    }

    static func at(_ iso: String) throws -> Timestamp {
        try #require(Timestamp(iso8601: iso))
    }

    // MARK: A local date that never existed

    /// Samoa (Pacific/Apia) and Tokelau (Pacific/Fakaofo) skipped 2011-12-30: their clocks went from 12-29 24:00
    /// to 12-31 00:00. A clock stepped minute by minute from 2011-12-28 09:00Z (before every zone's 12-28 00:05)
    /// to 2011-12-31 13:00Z creates no unit, row or skip record dated 12-30 in those zones, runs the 29th and the
    /// 31st at their own 00:05, and `metricsd status` never names 12-30 as their due date. Kiritimati (+14, no
    /// change) and Etc/GMT+12 (−12) run every date of the same nights. Each zone also has a user with no
    /// settings, whose skip record follows the same dates.
    @Test func aLocalDateThatNeverExistedGetsNoUnitRowOrSkip() async throws {
        let zones = ["Pacific/Apia", "Pacific/Fakaofo", "Pacific/Kiritimati", "Etc/GMT+12"]
        let skippedDate = "2011-12-30"
        try await withTestDatabase(poolSize: 2) { database in
            var users: [SeedUser] = []
            for (index, zone) in zones.enumerated() {
                users.append(SeedUser.valid(Int64(2 * index + 1), timezone: zone))
                var unsettled = SeedUser.valid(Int64(2 * index + 2), timezone: zone)
                unsettled.hasSettings = false
                users.append(unsettled)
            }
            try await database.seed(users)
            let queue = Self.queue(database)
            let status = StatusQueries(pool: database.pool)
            var minute = try Self.at("2011-12-28T09:00:00Z").millisecondsSinceEpoch
            let end = try Self.at("2011-12-31T13:00:00Z").millisecondsSinceEpoch
            var created: [String] = []
            while minute <= end {
                let now = Timestamp(millisecondsSinceEpoch: minute)
                let units = try await queue.enqueueDueUnits(dailyAt: .default, now: now)
                if !units.isEmpty {
                    created += units.map { "\($0.timezone) \($0.localDate)" }
                    try await ScheduleTests.runAll(queue, now: now)
                    let skips = try await database.value(
                        """
                        SELECT count(*) FROM metrics_skips k JOIN users u ON u.id = k.user_id
                        WHERE u.timezone IN ('Pacific/Apia', 'Pacific/Fakaofo') AND k.metrics_date = $1::date
                        """, [skippedDate])
                    #expect(skips == "0", "a skip record dated \(skippedDate) at \(now)")
                }
                minute += 60_000
            }
            #expect(!created.contains("Pacific/Apia \(skippedDate)"))
            #expect(!created.contains("Pacific/Fakaofo \(skippedDate)"))
            #expect(created.contains("Pacific/Kiritimati \(skippedDate)"))
            #expect(created.contains("Etc/GMT+12 \(skippedDate)"))

            // The rows of 12-29 … 12-31, each stamped with the instant its unit fell due.
            let rows = try await database.rows(
                """
                SELECT u.timezone, pm.metrics_date::text,
                       to_char(pm.computed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"')
                FROM profile_metrics pm JOIN users u ON u.id = pm.user_id
                WHERE pm.metrics_date BETWEEN '2011-12-29' AND '2011-12-31'
                ORDER BY 1, 2
                """)
            #expect(
                rows == [
                    ["Etc/GMT+12", "2011-12-29", "2011-12-29T12:05Z"],
                    ["Etc/GMT+12", "2011-12-30", "2011-12-30T12:05Z"],
                    ["Etc/GMT+12", "2011-12-31", "2011-12-31T12:05Z"],
                    ["Pacific/Apia", "2011-12-29", "2011-12-29T10:05Z"],
                    ["Pacific/Apia", "2011-12-31", "2011-12-30T10:05Z"],
                    ["Pacific/Fakaofo", "2011-12-29", "2011-12-29T11:05Z"],
                    ["Pacific/Fakaofo", "2011-12-31", "2011-12-30T11:05Z"],
                    ["Pacific/Kiritimati", "2011-12-29", "2011-12-28T10:05Z"],
                    ["Pacific/Kiritimati", "2011-12-30", "2011-12-29T10:05Z"],
                    ["Pacific/Kiritimati", "2011-12-31", "2011-12-30T10:05Z"],
                ])
            // No unit at all for the date that never was; one row per user, date and version.
            #expect(
                try await database.value(
                    "SELECT count(*) FROM daily_units WHERE local_date = $1::date AND timezone IN ('Pacific/Apia', 'Pacific/Fakaofo')",
                    [skippedDate]) == "0")
            #expect(
                try await database.value(
                    "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                ) == "0")
            // The users without settings were skipped on the same dates (their record is the latest verdict).
            #expect(
                try await database.rows(
                    "SELECT u.timezone, k.metrics_date::text FROM metrics_skips k JOIN users u ON u.id = k.user_id ORDER BY 1"
                ) == [
                    ["Etc/GMT+12", "2011-12-31"], ["Pacific/Apia", "2012-01-01"], ["Pacific/Fakaofo", "2012-01-01"],
                    ["Pacific/Kiritimati", "2012-01-01"],
                ])

            // Status, from the first instant of 12-31 in Apia (10:00Z; 11:00Z in Fakaofo) to its 00:05: the due
            // date is still 12-29, done; from 00:05 on it is 12-31, due at that instant.
            for (iso, zone, date, dueAt) in [
                ("2011-12-30T10:00:00Z", "Pacific/Apia", "2011-12-29", "2011-12-29T10:05:00Z"),
                ("2011-12-30T10:04:00Z", "Pacific/Apia", "2011-12-29", "2011-12-29T10:05:00Z"),
                ("2011-12-30T10:05:00Z", "Pacific/Apia", "2011-12-31", "2011-12-30T10:05:00Z"),
                ("2011-12-30T11:00:00Z", "Pacific/Fakaofo", "2011-12-29", "2011-12-29T11:05:00Z"),
                ("2011-12-30T11:04:00Z", "Pacific/Fakaofo", "2011-12-29", "2011-12-29T11:05:00Z"),
                ("2011-12-30T11:05:00Z", "Pacific/Fakaofo", "2011-12-31", "2011-12-30T11:05:00Z"),
            ] {
                let reported = try await status.zones(dailyAt: .default, version: 1, now: try Self.at(iso))
                let row = try #require(reported.first { $0.timezone == zone })
                #expect(row.dueDate == LocalDate(iso: date), "\(zone) at \(iso): due date \(row.dueDate)")
                #expect(row.dueAt == (try Self.at(dueAt)), "\(zone) at \(iso): due at \(row.dueAt)")
                #expect(row.state == .done, "\(zone) at \(iso): \(row.state)")
            }
        }
    }

    // MARK: A user who changes time zone

    /// Moves user 1 to `zone` at `now` as onboarding would (an UPDATE of `users.timezone`), then does what the
    /// settings listener does on the trigger's notification. The trigger stamps `user_settings.updated_at` with
    /// the database's real clock; the test moves that stamp to the injected instant, as if the change happened
    /// then, so that one clock rules the whole scenario.
    static func move(_ database: TestDatabase, _ queue: WorkQueue, to zone: String, at now: Timestamp) async throws {
        let before = try await database.value("SELECT updated_at::text FROM user_settings WHERE user_id = 1")
        try await database.execute("UPDATE users SET timezone = '\(zone)' WHERE id = 1")
        let stamped = try await database.value("SELECT updated_at::text FROM user_settings WHERE user_id = 1")
        #expect(stamped != before, "the zone change did not stamp the settings as changed")
        try await database.execute("UPDATE user_settings SET updated_at = '\(now.iso8601)' WHERE user_id = 1")
        try await queue.refreshUsers([1], now: now)
    }

    /// Decided behaviour for a time zone change, on the database clock. User 1 starts in Pacific/Kiritimati
    /// (+14), moves to Pacific/Pago_Pago (−11) at 2027-06-10 12:00Z (local 06-11 02:00 → 06-10 01:00, 25 h back)
    /// and back at 06-12 12:00Z (06-12 01:00 → 06-13 02:00, 25 h forward); users 2 and 3 stay in those zones.
    /// Every minute from 06-09 09:00Z to 06-14 00:00Z: the user never has a row dated after their current local
    /// date, and the newest row (what the latest-metrics read serves) is for their current metrics day. At the
    /// end, exactly one row per date: the 06-11 row written in Kiritimati was removed at the move back and written
    /// again at Pago_Pago's 06-11 00:05; 06-13, whose Kiritimati run had passed before the user came back, was
    /// written at the move.
    @Test func movingKiritimatiToPagoPagoAndBack() async throws {
        try await withTestDatabase(poolSize: 2) { database in
            try await database.seed([
                .valid(1, timezone: "Pacific/Kiritimati"), .valid(2, timezone: "Pacific/Kiritimati"),
                .valid(3, timezone: "Pacific/Pago_Pago"),
            ])
            let queue = Self.queue(database)
            let store = PostgresStore(pool: database.pool, formula: .current, logger: database.logger)
            try await store.serving {
                let moveAway = try Self.at("2027-06-10T12:00:00Z")
                let moveBack = try Self.at("2027-06-12T12:00:00Z")
                var minute = try Self.at("2027-06-09T09:00:00Z").millisecondsSinceEpoch
                let end = try Self.at("2027-06-14T00:00:00Z").millisecondsSinceEpoch
                var problems: [String] = []
                while minute <= end {
                    let now = Timestamp(millisecondsSinceEpoch: minute)
                    if now == moveAway {
                        try await Self.move(database, queue, to: "Pacific/Pago_Pago", at: now)
                    } else if now == moveBack {
                        try await Self.move(database, queue, to: "Pacific/Kiritimati", at: now)
                    }
                    if !(try await queue.enqueueDueUnits(dailyAt: .default, now: now)).isEmpty {
                        try await ScheduleTests.runAll(queue, now: now)
                    }
                    // Current local date and metrics day (the latest date whose 00:05 has passed; neither zone has a
                    // DST change) in the user's zone now, the newest row's date, and the latest date of any row.
                    let row = try await database.rows(
                        """
                        SELECT ($1::timestamptz AT TIME ZONE u.timezone)::date::text,
                               (($1::timestamptz AT TIME ZONE u.timezone) - interval '5 minutes')::date::text,
                               (SELECT metrics_date::text FROM profile_metrics WHERE user_id = 1
                                ORDER BY computed_at DESC LIMIT 1),
                               (SELECT max(metrics_date)::text FROM profile_metrics WHERE user_id = 1)
                        FROM users u WHERE u.id = 1
                        """, [now.iso8601]
                    ).first
                    if let row, (row[3] ?? "") > (row[0] ?? "") || row[2] != row[1] {
                        problems.append(
                            "\(now): local date \(row[0] ?? "?"), metrics day \(row[1] ?? "?"), newest row \(row[2] ?? "none"), latest date \(row[3] ?? "none")"
                        )
                    }
                    minute += 60_000
                }
                #expect(problems.isEmpty, "\(problems.prefix(5))")

                #expect(
                    try await database.rows(
                        """
                        SELECT metrics_date::text, to_char(computed_at AT TIME ZONE 'UTC', 'MM-DD"T"HH24:MI:SS.MS"Z"')
                        FROM profile_metrics WHERE user_id = 1 ORDER BY 1
                        """) == [
                            ["2027-06-09", "06-09T09:00:00.000Z"],  // the first tick's catch-up (Kiritimati)
                            // Kiritimati's at 06-09 10:05Z, refreshed at the move.
                            ["2027-06-10", "06-10T12:00:00.001Z"],
                            ["2027-06-11", "06-11T11:05:00.000Z"],  // Pago_Pago's 00:05
                            ["2027-06-12", "06-12T11:05:00.000Z"],  // Pago_Pago's 00:05
                            ["2027-06-13", "06-12T12:00:00.001Z"],  // at the move back
                            ["2027-06-14", "06-13T10:05:00.000Z"],  // Kiritimati's 00:05
                        ])
                // The users who stayed got every date once, at their zone's 00:05.
                #expect(
                    try await database.value(
                        "SELECT string_agg(metrics_date::text, ',' ORDER BY metrics_date) FROM profile_metrics WHERE user_id = 2"
                    )
                        == "2027-06-09,2027-06-10,2027-06-11,2027-06-12,2027-06-13,2027-06-14")
                #expect(
                    try await database.value(
                        "SELECT string_agg(metrics_date::text, ',' ORDER BY metrics_date) FROM profile_metrics WHERE user_id = 3"
                    )
                        == "2027-06-08,2027-06-09,2027-06-10,2027-06-11,2027-06-12,2027-06-13")
                // The read path serves the newest row: the 06-14 one.
                let latest = try #require(try await store.latestMetrics(userID: 1))
                #expect(latest.computedAt == (try Self.at("2027-06-13T10:05:00Z")))
            }
        }
    }

    /// A daily chunk that read a user before their zone change commits after it: the user gets no row for the
    /// old zone's date. The change's transaction holds the user's row while the chunk writes; the chunk waits
    /// for it (FOR SHARE), then sees the new zone and leaves the user out, and still finishes.
    @Test func aChunkThatReadAUserBeforeTheirMoveWritesNothingForThem() async throws {
        try await withTestDatabase(poolSize: 2) { database in
            try await database.seed([
                .valid(1, timezone: "Pacific/Kiritimati"), .valid(2, timezone: "Pacific/Kiritimati"),
            ])
            let queue = Self.queue(database)
            let now = try Self.at("2027-06-10T10:05:00Z")  // Kiritimati 06-11 00:05
            #expect(
                try await queue.enqueueDueUnits(dailyAt: .default, now: now).map(\.localDate.description) == [
                    "2027-06-11"
                ])
            let chunk = try #require(try await queue.claim(now: now))
            let mover = try await database.pool.openDedicatedConnection()
            try await database.pool.runBlocking {
                try mover.execute("BEGIN; UPDATE users SET timezone = 'Pacific/Pago_Pago' WHERE id = 1")
            }
            let processing = Task { try await queue.process(chunk, now: now) }
            // Wait until the chunk's write waits for the mover's row lock, then commit the move.
            var waited = false
            for _ in 0..<200 {
                let waiting = try await database.value(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%in_zone%'")
                if waiting == "1" {
                    waited = true
                    break
                }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(waited, "the chunk's write never waited for the zone change")
            try await database.pool.runBlocking { try mover.execute("COMMIT") }
            let progress = try await processing.value
            #expect(progress.end == .finished)
            #expect(
                try await database.rows(
                    "SELECT user_id::text, metrics_date::text FROM profile_metrics ORDER BY 1") == [
                        ["2", "2027-06-11"]
                    ])
            #expect(try await database.value("SELECT count(*) FROM metrics_skips") == "0")
        }
    }
}
