import Foundation
import MetricsdPostgres
import MetricsdTestSupport
import Testing

/// New time zone rules installed while the daemon runs (a tzdata update on the database server).
@Suite struct TzdataUpdateTests {
    static let zoneinfo = "/usr/share/zoneinfo"

    /// Compiles `Zone name ±h:mm - MTZ` (one fixed offset, in minutes) with zic into the system's zone directory,
    /// where PostgreSQL (built with the system tz database, as Debian's is) reads it when a session first uses it.
    static func compile(_ name: String, offsetMinutes: Int) throws {
        let magnitude = abs(offsetMinutes)
        let offset = (offsetMinutes < 0 ? "-" : "") + "\(magnitude / 60):" + String(format: "%02d", magnitude % 60)
        let source = FileManager.default.temporaryDirectory.appendingPathComponent("metricsd-\(UUID().uuidString).zic")
        try "Zone \(name) \(offset) - MTZ\n".write(to: source, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: source) }
        let zic = Process()
        zic.executableURL = URL(fileURLWithPath: "/usr/sbin/zic")
        zic.arguments = ["-d", Self.zoneinfo, source.path]
        let pipe = Pipe()
        zic.standardOutput = pipe
        zic.standardError = pipe
        try zic.run()
        zic.waitUntilExit()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        try #require(zic.terminationStatus == 0, "zic failed for \(name) \(offset): \(output)")
    }

    /// A zone of the test's own (a test-only name, removed afterwards even when the test fails) is compiled at
    /// an offset that makes its local time about 22:30; users live in it and `metricsd serve` runs with
    /// `METRICSD_DB_SESSION_MAX_AGE=3` and a 1 s tick. Once today's rows are written, the zone is recompiled
    /// two hours ahead, so its local time is past 00:30 of the next date. A session that had loaded the zone
    /// still sees the old rules (why sessions must be recycled) and a new one sees the new rules; the daemon
    /// writes the next date's rows within the bound: the session age plus one tick (plus slack for a loaded
    /// machine).
    @Test func aRuleChangeIsFollowedWithinTheSessionMaxAge() async throws {
        try #require(
            FileManager.default.isWritableFile(atPath: Self.zoneinfo),
            "\(Self.zoneinfo) must be writable to install a test zone (run the tests as root, as scripts/test does in CI)"
        )
        let directory = "MetricsdTest" + String(UInt32.random(in: .min ... .max), radix: 16)
        let name = directory + "/Zone"
        defer { try? FileManager.default.removeItem(atPath: Self.zoneinfo + "/" + directory) }
        let minuteOfDay = Int(Date().timeIntervalSince1970 / 60) % 1440
        var offset = 22 * 60 + 30 - minuteOfDay  // local 22:30 now
        if offset > 720 { offset -= 1440 }
        if offset <= -720 { offset += 1440 }
        try Self.compile(name, offsetMinutes: offset)

        try await withTestDatabase { database in
            try await database.seed((1...3).map { SeedUser.valid($0, timezone: name) })
            let pool = database.pool
            @Sendable func localNow(_ connection: PostgresConnection) async throws -> String {
                try await pool.runBlocking {
                    try connection.query("SELECT to_char(now() AT TIME ZONE $1, 'YYYY-MM-DD HH24:MI')", [name])
                        .requiredString(0, 0)
                }
            }
            let probe = try await pool.openDedicatedConnection()
            let before = try await localNow(probe)  // loads the zone's first rules into this session
            let today = String(before.prefix(10))
            let hour = before.dropFirst(11).prefix(2)
            #expect(hour == "22" || hour == "23", "local time \(before)")

            let port = DaemonProcess.freePort()
            // One pooled session, so the statements that decide due-ness always run on a session that has loaded
            // the zone (with more, one that never did could read the new rules by chance).
            let extra = [
                "METRICSD_DB_SESSION_MAX_AGE": "3", "METRICSD_TICK_SECONDS": "1", "METRICSD_WORKERS": "1",
                "METRICSD_DB_POOL_SIZE": "1",
            ]
            let daemon = try DaemonProcess(
                environment: DaemonProcess.environment(databaseURL: database.url, port: port, extra: extra), port: port)
            try await daemon.waitUntilReady()
            let rowsFor = { (date: String) async -> String? in
                try? await database.value("SELECT count(*) FROM profile_metrics WHERE metrics_date = $1::date", [date])
            }
            let caughtUp = await DaemonProcess.eventually(timeout: .seconds(60)) { await rowsFor(today) == "3" }
            #expect(caughtUp, "today's rows (\(today)) were not written; daemon output:\n\(daemon.log.suffix(2000))")

            // New rules: two hours ahead, past the next date's 00:05.
            let changed = ContinuousClock.now
            try Self.compile(name, offsetMinutes: offset + 120)
            let stale = try await localNow(probe)
            #expect(stale.prefix(10) == today, "a session that loaded the zone kept its rules: \(stale)")
            let fresh = try await localNow(try await pool.openDedicatedConnection())
            let tomorrow = String(fresh.prefix(10))
            #expect(tomorrow > today, "a new session reads the new rules: \(fresh)")

            let followed = await DaemonProcess.eventually(timeout: .seconds(30)) { await rowsFor(tomorrow) == "3" }
            let elapsed = ContinuousClock.now - changed
            #expect(
                followed,
                "the next date's rows (\(tomorrow)) were not written; daemon output:\n\(daemon.log.suffix(2000))")
            // The bound: 3 s session age + 1 s tick; the rest is slack for a loaded machine.
            #expect(elapsed < .seconds(15), "followed the new rules after \(elapsed)")
            print("TzdataUpdateTests: new rules followed after \(elapsed)")
            #expect(
                try await database.value(
                    "SELECT count(*) FROM daily_units WHERE timezone = $1 AND local_date = $2::date", [name, tomorrow])
                    == "1")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
