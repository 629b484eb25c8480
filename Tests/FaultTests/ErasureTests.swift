import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdTestSupport
import Testing

/// Erasure: the product deletes a person with `DELETE FROM users` (the cascade takes their settings, metrics, kept
/// row, skip record and acknowledgement) while two real daemons run that person's daily unit, a recompute-all
/// chunk and a settings recompute. Nothing of theirs comes back, and no one else of those batches goes without.
@Suite(.serialized) struct ErasureTests {
    static let users = 3000
    static let zones = ["Asia/Kathmandu", "America/Havana"]
    static let rounds = 5
    static let perRound = 40

    /// Each round: the day's rows removed and its units made due again, and a recompute-all job started, so both
    /// daemons write a row for every user (batches of 50, one daemon holding each batch 20 ms before its COMMIT);
    /// once a daily chunk is under way, 40 users spread over the id range are deleted one by one, each right
    /// after their settings changed (a settings recompute of them in flight), while other users' settings change
    /// too. After each round's units and job are done: no row of a deleted user in any partition, the latest
    /// table, the skip records or the acknowledgements, and every remaining user has the day's row; at the end the
    /// same on the streaming standby once it has replayed the primary's last commit.
    @Test(.timeLimit(.minutes(8))) func deletedUsersStayDeletedAndTheirBatchesComplete() async throws {
        try await withReplicaPair("erasure", synchronous: false) { pair in
            let url = pair.url(of: pair.first)
            try await Fault.migrate(url)
            let database = FaultDatabase(url: url, applicationName: "erasure-test")
            try await database.execute(
                Fault.seedSQL(count: Self.users, zones: Self.zones, invalidEvery: nil) + BulkDeleteTests.history)
            let dailyAt = try await Fault.dailyTime(database)
            let extra = [
                "METRICSD_CHUNK_SIZE": "500", "METRICSD_BATCH_SIZE": "50", "METRICSD_WORKERS": "2",
                "METRICSD_TICK_SECONDS": "0.3",
            ]
            let a = try Fault.start(url, dailyAt: dailyAt, name: "metricsd", extra: extra)
            var delayed = extra
            delayed["METRICSD_FAULTS"] = "batch-delay-ms=20"
            let b = try Fault.start(url, dailyAt: dailyAt, name: "metricsd", extra: delayed)
            try await a.waitUntilReady()
            try await b.waitUntilReady()
            try #require(await BulkDeleteTests.unitsDone(database), "the first units:\n\(a.log.suffix(2000))")

            let load = BulkDeleteTests.Load()
            defer { load.stop() }
            let settings = Task { await BulkDeleteTests.changeSettings(database, until: load) }
            var deleted: [Int64] = []
            var random = SplitMix64(seed: 17)
            var failures: [String] = []
            for round in 1...Self.rounds {
                try await BulkDeleteTests.makeTheDayDueAgain(database)
                let job = try await a.request(
                    "/v1/admin/recompute", method: .post,
                    headers: [
                        .authorization: "Bearer \(DaemonProcess.secrets.adminToken)", .contentType: "application/json",
                    ], body: "{}")
                #expect(
                    job.status == .accepted || job.status == .ok, "round \(round): recompute \(job.status) \(job.text)")
                let underWay = await Fault.waitUntil(timeout: .seconds(60), poll: .milliseconds(10)) {
                    try await database.int("SELECT count(*) FROM work_chunks WHERE cursor_user_id > range_start") > 0
                }
                #expect(underWay != nil, "round \(round): no chunk under way")
                var attempts = 0
                while deleted.count < round * Self.perRound && attempts < 4 * Self.perRound {
                    attempts += 1
                    let user = Int64(random.next(upTo: Self.users) + 1)
                    guard !deleted.contains(user) else { continue }
                    do {
                        try await database.execute(
                            "UPDATE user_settings SET current_weight = current_weight + 1 WHERE user_id = \(user)")
                        if try await database.int(
                            "WITH gone AS (DELETE FROM users WHERE id = \(user) RETURNING 1) SELECT count(*) FROM gone")
                            == 1
                        {
                            deleted.append(user)
                        }
                    } catch {
                        failures.append("round \(round), deleting user \(user): \(error)")
                    }
                    try await Task.sleep(for: .milliseconds(Int.random(in: 0...15, using: &random)))
                }
                #expect(
                    await BulkDeleteTests.unitsDone(database), "round \(round): units not done\n\(b.log.suffix(2000))")
                let finished = await Fault.waitUntil(timeout: .seconds(120)) {
                    try await database.int("SELECT count(*) FROM work_chunks WHERE state IN ('pending', 'running')")
                        == 0
                }
                #expect(finished != nil, "round \(round): work left\n\(a.log.suffix(2000))")
                let (resurrected, missing) = try await Self.count(database, deleted: deleted)
                #expect(resurrected == 0, "round \(round): \(resurrected) rows of deleted users")
                #expect(missing == 0, "round \(round): \(missing) remaining users without the day's row")
            }
            load.stop()
            let changed = await settings.value
            a.signal(SIGTERM)
            b.signal(SIGTERM)
            #expect(await a.waitForExit() == 0, "\(a.log.suffix(2000))")
            #expect(await b.waitForExit() == 0, "\(b.log.suffix(2000))")
            let (resurrected, missing) = try await Self.count(database, deleted: deleted)
            let (standbyResurrected, standbyMissing, replay) = try await Self.afterReplay(
                pair, deleted: deleted, primary: database)
            #expect(
                standbyResurrected == 0 && standbyMissing == 0,
                "the standby after replay: \(standbyResurrected) rows of deleted users, \(standbyMissing) users missing"
            )
            let failedChunks = try await database.int("SELECT count(*) FROM work_chunks WHERE state = 'failed'")
            print(
                "erasure: \(deleted.count) users deleted in \(Self.rounds) rounds beside daily units, recompute-all and "
                    + "\(changed) settings changes; resurrected rows \(resurrected), remaining users missing the day's row \(missing), "
                    + "failed chunks \(failedChunks); on the standby after replay (caught up \(replay) after the last commit): "
                    + "\(standbyResurrected) and \(standbyMissing); batches retried after meeting a deleted user's foreign key: "
                    + "\(Self.foreignKeyFailures(a.log) + Self.foreignKeyFailures(b.log))")
            #expect(failures.isEmpty, "\(failures)")
            #expect(deleted.count == Self.rounds * Self.perRound, "200 deletions: \(deleted.count)")
            #expect(resurrected == 0 && missing == 0 && failedChunks == 0)
        }
    }

    /// The same counts on the standby (read with psql: metricsd's connections refuse a standby) once it has
    /// replayed everything the primary has written, and how long after the primary's last commit that was.
    static func afterReplay(_ pair: ReplicaPair, deleted: [Int64], primary: FaultDatabase) async throws
        -> (resurrected: Int, missing: Int, replay: Duration)
    {
        let started = ContinuousClock.now
        let lsn = try #require(try await primary.value("SELECT pg_current_wal_lsn()::text"))
        let caughtUp = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(10)) {
            try await pair.second.value("SELECT pg_last_wal_replay_lsn() >= '\(lsn)'::pg_lsn") == "t"
        }
        let replay = (caughtUp ?? ContinuousClock.now) - started
        try #require(caughtUp != nil, "the standby did not replay up to \(lsn)")
        let (resurrected, missing) = try await Self.count(deleted: deleted) {
            Int(try await pair.second.value($0)) ?? -1
        }
        return (resurrected, missing, replay)
    }

    /// The daemon's log lines about a write refused for a user deleted meanwhile (the batch is retried).
    static func foreignKeyFailures(_ log: String) -> Int {
        log.split(separator: "\n").filter { $0.contains("foreign key") }.count
    }

    /// Rows anywhere that belong to a deleted user, and remaining users without a row for their zone's unit date.
    static func count(_ database: FaultDatabase, deleted: [Int64]) async throws -> (resurrected: Int, missing: Int) {
        try await Self.count(deleted: deleted) { try await database.int($0) }
    }

    static func count(deleted: [Int64], _ int: (String) async throws -> Int) async throws -> (
        resurrected: Int, missing: Int
    ) {
        let ids = "'{" + deleted.map(String.init).joined(separator: ",") + "}'::bigint[]"
        let resurrected = try await int(
            """
            SELECT (SELECT count(*) FROM profile_metrics WHERE user_id = ANY(\(ids)))
                 + (SELECT count(*) FROM profile_metrics_latest WHERE user_id = ANY(\(ids)))
                 + (SELECT count(*) FROM metrics_skips WHERE user_id = ANY(\(ids)))
                 + (SELECT count(*) FROM metrics_acknowledgements WHERE user_id = ANY(\(ids)))
                 + (SELECT count(*) FROM user_settings WHERE user_id = ANY(\(ids)))
            """)
        let missing = try await int(
            """
            SELECT count(*) FROM users u JOIN daily_units d ON d.timezone = u.timezone
            WHERE NOT EXISTS (SELECT 1 FROM profile_metrics p
                              WHERE p.user_id = u.id AND p.metrics_date = d.local_date AND p.version = d.version)
            """)
        return (resurrected, missing)
    }
}
