import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdTestSupport
import Synchronization
import Testing

/// One statement deleting many users' rows at once — every user's newest row, or users themselves (the cascade) —
/// while two real daemons do their daily units, recompute users whose settings change and serve the latest read:
/// no deadlock, on either side, in ten rounds.
@Suite(.serialized) struct BulkDeleteTests {
    static let users = 3000
    static let zones = ["Asia/Kathmandu", "America/Havana"]

    /// Each round: the day's rows are removed and the day's units made due again, so the daemons write a row for
    /// every user (batches of 100, one of the daemons holding each batch 20 ms before its COMMIT); once a unit is
    /// under way, one statement deletes, in turn, every user's newest row; every row of formula version 1 of half
    /// of the users (who are left with none); 60 users, whose rows, kept rows and settings go with them.
    /// Throughout, settings of one to three users change every 20 ms (the daemons recompute them) and the latest
    /// read is asked for. Afterwards: no "deadlock detected" in the server's log or either daemon's, every bulk
    /// statement succeeded, and the latest table holds each user's newest row.
    @Test(.timeLimit(.minutes(8))) func bulkDeletesBesideTwoDaemonsNeverDeadlock() async throws {
        try await withThrowawayCluster("bulk-delete") { cluster in
            try await cluster.start()
            try await Fault.migrate(cluster.url)
            let database = FaultDatabase(url: cluster.url, applicationName: "bulk-delete-test")
            try await database.execute(
                Fault.seedSQL(count: Self.users, zones: Self.zones, invalidEvery: nil) + Self.history)
            let dailyAt = try await Fault.dailyTime(database)
            let extra = [
                "METRICSD_CHUNK_SIZE": "1000", "METRICSD_BATCH_SIZE": "100", "METRICSD_WORKERS": "2",
                "METRICSD_TICK_SECONDS": "0.3",
            ]
            let a = try Fault.start(cluster.url, dailyAt: dailyAt, name: "metricsd", extra: extra)
            var delayed = extra
            delayed["METRICSD_FAULTS"] = "batch-delay-ms=20"
            let b = try Fault.start(cluster.url, dailyAt: dailyAt, name: "metricsd", extra: delayed)
            try await a.waitUntilReady()
            try await b.waitUntilReady()
            try #require(await Self.unitsDone(database), "the first units:\n\(a.log.suffix(2000))")

            let load = Load()
            defer { load.stop() }  // the loops end (and let go of the daemons) however the test ends
            let reads = Task { await Self.read(from: [a, b], until: load) }
            let settings = Task { await Self.changeSettings(database, until: load) }
            var failures: [String] = []
            var removed = 0
            for round in 1...10 {
                do {
                    try await Self.makeTheDayDueAgain(database)
                } catch {
                    failures.append("round \(round), making the day due again: \(error)")
                }
                let underWay = await Fault.waitUntil(timeout: .seconds(60), poll: .milliseconds(20)) {
                    try await database.int(
                        "SELECT count(*) FROM work_chunks WHERE kind = 'daily' AND cursor_user_id > range_start") > 0
                }
                #expect(underWay != nil, "round \(round): no unit under way")
                let statement = [Self.deleteUsers, Self.deleteNewestRows, Self.deleteVersion(half: round % 2)][
                    round % 3]
                do {
                    removed += try await database.int(statement)
                } catch {
                    failures.append("round \(round): \(error)")
                }
                #expect(await Self.unitsDone(database), "round \(round): units not done\n\(b.log.suffix(2000))")
            }
            load.stop()
            let (answered, changed) = (await reads.value, await settings.value)
            a.signal(SIGTERM)
            b.signal(SIGTERM)
            #expect(await a.waitForExit() == 0, "\(a.log.suffix(2000))")
            #expect(await b.waitForExit() == 0, "\(b.log.suffix(2000))")

            let serverLog =
                (try? String(contentsOfFile: cluster.directory + "/log/postgresql.log", encoding: .utf8)) ?? ""
            let deadlocks = serverLog.components(separatedBy: "deadlock detected").count - 1
            print(
                "bulk-delete: 10 rounds, \(removed) rows and users removed, \(answered) reads, \(changed) settings changes, "
                    + "deadlocks: server \(deadlocks), daemons \(Self.deadlocks(in: a.log)) and \(Self.deadlocks(in: b.log))"
            )
            #expect(failures.isEmpty, "\(failures)")
            #expect(deadlocks == 0, "\(Self.deadlockReports(serverLog))")
            #expect(Self.deadlocks(in: a.log) + Self.deadlocks(in: b.log) == 0)
            #expect(removed >= 3 * 2500, "every user's newest row was deleted in three rounds")
            #expect(answered >= 100 && changed >= 100, "the load ran: \(answered) reads, \(changed) settings changes")
            let kept = try await database.value(
                "SELECT string_agg(concat_ws('|', user_id, metrics_id, computed_at), ';' ORDER BY user_id) FROM profile_metrics_latest"
            )
            let newest = try await database.value(
                """
                SELECT string_agg(concat_ws('|', user_id, id, computed_at), ';' ORDER BY user_id)
                FROM (SELECT DISTINCT ON (user_id) * FROM profile_metrics ORDER BY user_id, computed_at DESC, id DESC) n
                """)
            #expect(kept == newest, "the latest table holds each user's newest row")
        }
    }

    /// 20 days of version-1 history before today for every user, in the latest table too.
    static let history = """
        INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
        SELECT u.id, 22.0 + u.id % 50 / 10.0, 1500 + u.id % 400, 2000 + u.id % 900, 1, current_date - d,
               (current_date - d)::timestamptz + interval '5 minutes'
        FROM generate_series(1, 20) d CROSS JOIN users u ORDER BY d DESC, u.id;
        ANALYZE profile_metrics;
        """

    /// Every user's newest row, in one statement; returns how many rows went.
    static let deleteNewestRows = """
        WITH gone AS (
          DELETE FROM profile_metrics p USING profile_metrics_latest l
          WHERE p.id = l.metrics_id AND p.metrics_date = l.metrics_date RETURNING 1)
        SELECT count(*) FROM gone
        """

    /// An operator's clean-up of a formula version (every row here is version 1) for half of the users, who are
    /// left without any row; returns how many rows went.
    static func deleteVersion(half: Int) -> String {
        "WITH gone AS (DELETE FROM profile_metrics WHERE version = 1 AND user_id % 2 = \(half) RETURNING 1) SELECT count(*) FROM gone"
    }

    /// 60 users spread over the id range, with everything that references them; returns how many went.
    static let deleteUsers = """
        WITH gone AS (
          DELETE FROM users WHERE id IN (SELECT id FROM users ORDER BY (id * 2654435761) % 1000003 LIMIT 60) RETURNING 1)
        SELECT count(*) FROM gone
        """

    /// The rows of each zone's due date removed and its unit forgotten: the daemons' next tick makes it again.
    static func makeTheDayDueAgain(_ database: FaultDatabase) async throws {
        try await database.execute(
            """
            DELETE FROM profile_metrics p USING daily_units d, users u
            WHERE p.user_id = u.id AND u.timezone = d.timezone AND p.metrics_date = d.local_date AND p.version = d.version;
            DELETE FROM work_chunks WHERE kind = 'daily';
            DELETE FROM daily_units;
            """)
    }

    static func unitsDone(_ database: FaultDatabase) async -> Bool {
        await Fault.waitUntil(timeout: .seconds(120)) {
            try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == Self.zones.count
        } != nil
    }

    /// The server's reports of deadlocks: each error line with who waited for what, and the CONTEXT line (where
    /// in a statement or trigger the reporting process waited).
    static func deadlockReports(_ log: String) -> String {
        let lines = log.split(separator: "\n")
        return lines.indices.filter { lines[$0].contains("deadlock detected") }.map { start in
            let pid = lines[start].split(separator: "[").dropFirst().first?.split(separator: "]").first ?? ""
            return lines[start..<min(lines.count, start + 200)]
                .filter {
                    $0.contains("\tProcess ")
                        || ($0.contains("[\(pid)]") && ($0.contains("CONTEXT") || $0.contains("deadlock")))
                }
                .prefix(8).joined(separator: "\n")
        }.joined(separator: "\n---\n")
    }

    static func deadlocks(in log: String) -> Int {
        log.components(separatedBy: "deadlock").count - 1
    }

    /// Reads the latest metrics of random users from both daemons until stopped; returns how many were answered.
    static func read(from daemons: [DaemonProcess], until load: Load) async -> Int {
        var answered = 0
        var random = SplitMix64(seed: 44)
        while !load.stopped {
            let user = Int64(random.next(upTo: Self.users) + 1)
            let daemon = daemons[random.next(upTo: daemons.count)]
            let response = try? await daemon.request(
                "/v1/profile/metrics/today", headers: TestTokens.bearer(TestTokens.user(user)))
            if let code = response?.status.code, code == 200 || code == 404 { answered += 1 }
        }
        return answered
    }

    /// Changes the weight of one to three random users every 20 ms until stopped; returns how many statements ran.
    static func changeSettings(_ database: FaultDatabase, until load: Load) async -> Int {
        var changed = 0
        var random = SplitMix64(seed: 43)
        while !load.stopped {
            let users = (0...random.next(upTo: 3)).map { _ in String(random.next(upTo: Self.users) + 1) }
            if (try? await database.execute(
                "UPDATE user_settings SET current_weight = 45 + (current_weight + 0.25) % 80 WHERE user_id IN (\(users.joined(separator: ",")))"
            ))
                != nil
            {
                changed += 1
            }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return changed
    }

    final class Load: Sendable {
        private let flag = Atomic<Bool>(false)
        var stopped: Bool { self.flag.load(ordering: .relaxed) }
        func stop() { self.flag.store(true, ordering: .relaxed) }
    }
}
