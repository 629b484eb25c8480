import Foundation
import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdTestSupport
import MetricsdWork
import Testing

/// When daily units fall due, decided by PostgreSQL's clock and tz rules with an injected "now".
@Suite struct ScheduleTests {
    struct DSTCase: Decodable, Sendable, CustomTestStringConvertible {
        let zone: String
        let date: String
        let kind: String
        let dueAt: String
        var testDescription: String { "\(self.kind) \(self.zone) \(self.date)" }
    }

    struct DSTFixture: Decodable {
        let tzdata: String
        let cases: [DSTCase]
    }

    static let fixture: DSTFixture = {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
            "Fixtures/dst-cases.json")
        return try! JSONDecoder().decode(DSTFixture.self, from: Data(contentsOf: url))
    }()

    static func queue(_ database: TestDatabase, owner: String = "w1") -> WorkQueue {
        WorkQueue(pool: database.pool, formula: .current, owner: owner, logger: database.logger)
    }

    /// The database clock the minute ticks align to: the server's own time, and its offset from this host's,
    /// which for a server on this host is a round trip at most.
    @Test func databaseClockIsTheServersAndItsOffsetIsMeasured() async throws {
        try await withTestDatabase { database in
            let before = Date().timeIntervalSince1970
            let clock = try await Self.queue(database).databaseClock()
            let after = Date().timeIntervalSince1970
            #expect(
                clock.now >= before - 0.5 && clock.now <= after + 0.5, "\(clock.now) not within [\(before), \(after)]")
            #expect(abs(clock.offset) < 0.5, "offset \(clock.offset) s from a server on this host")
        }
    }

    @Test func fixtureMatchesTheSystemTimeZoneDatabase() throws {
        let header = try String(contentsOfFile: "/usr/share/zoneinfo/tzdata.zi", encoding: .utf8).prefix(40)
        #expect(
            header.hasPrefix("# version \(Self.fixture.tzdata)"),
            "the DST cases were generated from tzdata \(Self.fixture.tzdata) but the system has \(header.split(separator: "\n").first ?? ""): run scripts/gen-dst-cases"
        )
        let kinds = Dictionary(grouping: Self.fixture.cases, by: \.kind).mapValues(\.count)
        #expect((kinds["gap"] ?? 0) >= 15)
        #expect((kinds["overlap"] ?? 0) >= 3)
    }

    /// Every 2025–2027 gap and overlap covering 00:05, in every zone, plus zones with unusual offsets: the unit
    /// is created at the expected instant and not one minute earlier, its row is stamped with that instant, an
    /// overlap's second 00:05 creates nothing, and the reporting `due_at` agrees. One database, one user per
    /// zone, cases in time order (as a real clock would meet them).
    @Test func dstCasesRunAtTheExpectedInstant() async throws {
        let cases = Self.fixture.cases.sorted { $0.dueAt < $1.dueAt }
        let zones = Array(Set(cases.map(\.zone))).sorted()
        try await withTestDatabase(poolSize: 2) { database in
            try await database.seed(
                zones.enumerated().map { SeedUser.valid(Int64($0.offset + 1), timezone: $0.element) })
            let queue = Self.queue(database)
            let status = StatusQueries(pool: database.pool)
            // Cases sharing an instant (a zone and its alias) meet the same clock readings.
            let instants = Dictionary(grouping: cases, by: \.dueAt).sorted { $0.key < $1.key }
            for (dueText, group) in instants {
                let due = try #require(Timestamp(iso8601: dueText))
                let minuteBefore = Timestamp(millisecondsSinceEpoch: due.millisecondsSinceEpoch - 60_000)
                let hourAfter = Timestamp(millisecondsSinceEpoch: due.millisecondsSinceEpoch + 3_600_000)

                let early = try await queue.enqueueDueUnits(dailyAt: .default, now: minuteBefore)
                try await Self.runAll(queue, now: minuteBefore)
                let onTime = try await queue.enqueueDueUnits(dailyAt: .default, now: due)
                try await Self.runAll(queue, now: due)
                let second = try await queue.enqueueDueUnits(dailyAt: .default, now: hourAfter)
                try await Self.runAll(queue, now: hourAfter)
                let reported = try await status.zones(dailyAt: .default, version: 1, now: due)

                for dstCase in group {
                    let date = try #require(LocalDate(iso: dstCase.date))
                    let name = dstCase.testDescription
                    #expect(
                        !early.contains { $0.timezone == dstCase.zone && $0.localDate == date },
                        "\(name): created a minute early")
                    #expect(
                        onTime.filter { $0.timezone == dstCase.zone }.map(\.localDate) == [date],
                        "\(name): not created at \(due)")
                    #expect(!second.contains { $0.timezone == dstCase.zone }, "\(name): a second unit an hour later")
                    let stamp = try await database.value(
                        """
                        SELECT to_char(pm.computed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                        FROM profile_metrics pm JOIN users u ON u.id = pm.user_id
                        WHERE u.timezone = $1 AND pm.metrics_date = $2
                        """, [dstCase.zone, dstCase.date])
                    #expect(stamp == dstCase.dueAt, "\(name): row stamped \(stamp ?? "nil")")
                    let zone = reported.first { $0.timezone == dstCase.zone }
                    #expect(zone?.dueAt == due, "\(name): status due_at \(String(describing: zone?.dueAt))")
                    #expect(zone?.dueDate == date, "\(name): status due date")
                }
            }
            #expect(
                try await database.value(
                    "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                ) == "0")
        }
    }

    /// Claims and processes every free chunk at `now`.
    static func runAll(_ queue: WorkQueue, now: Timestamp?) async throws {
        while let chunk = try await queue.claim(now: now) {
            let progress = try await queue.process(chunk, now: now)
            #expect(progress.end == .finished)
        }
        _ = try await queue.finishCompleted(now: now)
    }

    /// A clock stepped minute by minute over 61 days with DST changes in many zones (March–April 2026), users in
    /// 60 zones: every user gets exactly one row per local date, at the first minute at or after local 00:05 and
    /// never before. The two months run as two halves at once, each on its own database (they overlap by two days,
    /// so every date is checked in one of them).
    @Test func minuteByMinuteOverSixtyDays() async throws {
        let zones = [
            "America/Havana", "Atlantic/Azores", "America/Santiago", "Asia/Beirut", "Africa/Cairo", "Europe/London",
            "Europe/Berlin", "Europe/Helsinki", "Europe/Moscow", "America/New_York", "America/Chicago",
            "America/Denver", "America/Los_Angeles", "America/Anchorage", "Pacific/Honolulu", "America/St_Johns",
            "America/Halifax", "America/Sao_Paulo", "America/Asuncion", "America/Mexico_City", "Asia/Kathmandu",
            "Asia/Kolkata", "Asia/Tehran", "Asia/Kabul", "Asia/Yangon", "Asia/Tokyo", "Asia/Shanghai",
            "Australia/Sydney", "Australia/Adelaide", "Australia/Lord_Howe", "Australia/Eucla", "Australia/Darwin",
            "Australia/Perth", "Pacific/Auckland", "Pacific/Chatham", "Pacific/Kiritimati", "Pacific/Apia",
            "Pacific/Tongatapu", "Pacific/Marquesas", "Pacific/Pago_Pago", "Etc/GMT+12", "Etc/GMT-14", "UTC",
            "Asia/Gaza", "Asia/Jerusalem", "Europe/Dublin", "Africa/Casablanca", "Antarctica/Troll",
            "America/Nuuk", "America/Scoresbysund", "Asia/Dubai", "Africa/Lagos", "Africa/Johannesburg",
            "America/Bogota", "America/Caracas", "Asia/Singapore", "Asia/Manila", "Indian/Cocos",
            "Asia/Colombo", "Pacific/Norfolk",
        ]
        #expect(zones.count >= 50)
        let halves = [
            (start: "2026-03-01T00:00:00Z", end: "2026-04-01T00:00:00Z", checked: ("2026-03-02", "2026-03-30")),
            (start: "2026-03-30T00:00:00Z", end: "2026-05-01T00:00:00Z", checked: ("2026-03-31", "2026-04-29")),
        ]
        let units = try await withThrowingTaskGroup(of: Int.self) { group in
            for half in halves {
                group.addTask {
                    try await Self.minuteByMinute(zones: zones, from: half.start, to: half.end, checking: half.checked)
                }
            }
            return try await group.reduce(0, +)
        }
        #expect(units > 60 * zones.count - zones.count)
    }

    /// One stretch of ``minuteByMinuteOverSixtyDays()`` on its own database: the units it created.
    static func minuteByMinute(
        zones: [String], from startText: String, to endText: String, checking dates: (String, String)
    ) async throws -> Int {
        try await withTestDatabase(poolSize: 2) { database in
            try await database.seed(
                zones.enumerated().flatMap { index, zone in
                    [
                        SeedUser.valid(Int64(2 * index + 1), timezone: zone),
                        SeedUser.valid(Int64(2 * index + 2), timezone: zone),
                    ]
                })
            let queue = Self.queue(database)
            let start = try #require(Timestamp(iso8601: startText)).millisecondsSinceEpoch
            let end = try #require(Timestamp(iso8601: endText)).millisecondsSinceEpoch
            var minute = start
            var units = 0
            while minute <= end {
                let now = Timestamp(millisecondsSinceEpoch: minute)
                let created = try await queue.enqueueDueUnits(dailyAt: .default, now: now)
                if !created.isEmpty {
                    units += created.count
                    try await Self.runAll(queue, now: now)
                }
                minute += 60_000
            }
            // Exactly one row per (user, date, version).
            #expect(
                try await database.value(
                    "SELECT count(*) FROM (SELECT 1 FROM profile_metrics GROUP BY user_id, metrics_date, version HAVING count(*) > 1) d"
                ) == "0")
            // Every user has a row for every local date whose 00:05 fell inside the stretch.
            let missing = try await database.rows(
                """
                SELECT u.id, u.timezone, d::date FROM users u
                CROSS JOIN generate_series($1::date, $2::date, '1 day') d
                WHERE NOT EXISTS (SELECT 1 FROM profile_metrics pm WHERE pm.user_id = u.id AND pm.metrics_date = d::date)
                LIMIT 5
                """, [dates.0, dates.1])
            #expect(missing.isEmpty, "missing rows: \(missing)")
            // Never before local 00:05, and (apart from the catch-up of the first instant) at the first minute at
            // or after it.
            let wrong = try await database.rows(
                """
                SELECT u.timezone, pm.metrics_date, pm.computed_at FROM profile_metrics pm JOIN users u ON u.id = pm.user_id
                WHERE (pm.computed_at AT TIME ZONE u.timezone) < pm.metrics_date + time '00:05'
                   OR (pm.computed_at > $1::timestamptz
                       AND ((pm.computed_at - interval '1 minute') AT TIME ZONE u.timezone) >= pm.metrics_date + time '00:05')
                LIMIT 5
                """, [startText])
            #expect(wrong.isEmpty, "rows at the wrong instant: \(wrong)")
            return units
        }
    }

    // MARK: Catch-up

    @Test func daemonDownAtTheDailyTimeCatchesUpForTodayOnly() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...10).map { SeedUser.valid($0, timezone: "Europe/Berlin") })
            let queue = Self.queue(database)
            // Last run on 2026-06-10; the daemon comes back on 2026-06-14 at 10:00 Berlin time.
            try await Self.runAll(queue, now: try await Self.enqueued(queue, "2026-06-09T22:10:00Z"))
            let back = try await Self.enqueued(queue, "2026-06-14T08:00:00Z")
            try await Self.runAll(queue, now: back)
            let dates = try await database.rows("SELECT DISTINCT metrics_date::text FROM profile_metrics ORDER BY 1")
            #expect(dates == [["2026-06-10"], ["2026-06-14"]], "no back-filling of 06-11 … 06-13")
        }
    }

    @Test func unfinishedOlderUnitIsSupersededNotBackFilled() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...10).map { SeedUser.valid($0, timezone: "Asia/Tokyo") })
            let queue = Self.queue(database)
            // The 2026-06-10 unit is created, then every instance dies before running it.
            _ = try await Self.enqueued(queue, "2026-06-09T15:10:00Z")
            // Two days later at 09:00 Tokyo.
            let later = try await Self.enqueued(queue, "2026-06-12T00:00:00Z")
            try await Self.runAll(queue, now: later)
            #expect(
                try await database.rows("SELECT local_date::text, state FROM daily_units ORDER BY 1") == [
                    ["2026-06-10", "superseded"], ["2026-06-12", "done"],
                ])
            #expect(
                try await database.rows("SELECT DISTINCT metrics_date::text FROM profile_metrics") == [["2026-06-12"]])
        }
    }

    /// Decided behaviour: between local midnight and the daily time the zone's current metrics day is still
    /// yesterday. A daemon that comes back at 00:03 after missing yesterday's run runs it at once (yesterday's
    /// row, two minutes before today's), then today's at 00:05; nothing older is ever computed.
    @Test func restartAtThreeMinutesPastMidnight() async throws {
        try await withTestDatabase { database in
            try await database.seed([SeedUser.valid(1, timezone: "UTC")])
            let queue = Self.queue(database)
            try await Self.runAll(queue, now: try await Self.enqueued(queue, "2026-06-08T00:05:00Z"))
            // Down from 2026-06-08 23:00 to 2026-06-10 00:03: the 06-09 run was missed.
            let at0003 = try await Self.enqueued(queue, "2026-06-10T00:03:00Z")
            try await Self.runAll(queue, now: at0003)
            let at0005 = try await Self.enqueued(queue, "2026-06-10T00:05:00Z")
            try await Self.runAll(queue, now: at0005)
            #expect(
                try await database.rows(
                    "SELECT metrics_date::text, to_char(computed_at AT TIME ZONE 'UTC', 'MM-DD HH24:MI') FROM profile_metrics ORDER BY 1"
                ) == [
                    ["2026-06-08", "06-08 00:05"], ["2026-06-09", "06-10 00:03"], ["2026-06-10", "06-10 00:05"],
                ])
        }
    }

    @Test func unknownTimezoneIsSkippedWithAReason() async throws {
        try await withTestDatabase { database in
            try await database.seed([
                SeedUser.valid(1, timezone: "Mars/Olympus_Mons"), SeedUser.valid(2, timezone: "UTC"),
                SeedUser.valid(3, timezone: "PST"), SeedUser.valid(4, timezone: "UTC+3"),
            ])
            let queue = Self.queue(database)
            try await Self.runAll(queue, now: try await Self.enqueued(queue, "2026-06-10T12:00:00Z"))
            #expect(try await database.rows("SELECT user_id::text FROM profile_metrics") == [["2"]])
            let skips = try await database.rows("SELECT user_id::text, reasons FROM metrics_skips ORDER BY 1")
            #expect(
                skips == [
                    ["1", "timezone 'Mars/Olympus_Mons' is not a time zone the database knows"],
                    ["3", "timezone 'PST' is not a time zone the database knows"],
                    ["4", "timezone 'UTC+3' is not a time zone the database knows"],
                ])
        }
    }

    static func enqueued(_ queue: WorkQueue, _ iso: String) async throws -> Timestamp {
        let now = try #require(Timestamp(iso8601: iso))
        _ = try await queue.enqueueDueUnits(dailyAt: .default, now: now)
        return now
    }
}
