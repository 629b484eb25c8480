import Foundation
import HealthMetrics
import MetricsdTestSupport
import Testing

/// The real `metricsd` binary reading the latest metrics from streaming standbys: a primary and two asynchronous
/// standbys (``StandbySet``), one daemon with `METRICSD_READ_DATABASE_URL` naming both and a 3 s bound. One set-up
/// serves every case, in order. Where reads land is told by each server's own statistics (`pg_stat_statements`:
/// the rows the latest-read statements returned there), not by the daemon's counters; when the daemon stops or
/// resumes using a server is read from its `/metrics` (`metricsd_read_server_usable`), what a client sees from its
/// answers. Each case prints its figures.
@Suite(.serialized) struct StandbyReadTests {
    static let bound = 3.0
    /// Slack for what the test itself adds to a bound it measures: its polling (50 ms) and one request.
    static let slack = 0.5

    @Test(.timeLimit(.minutes(8))) func latestReadsFromStandbysWithinTheBound() async throws {
        let started = ContinuousClock.now
        try await withStandbySet("standby-reads", standbys: 2) { set in
            let url = set.primaryURL
            try await Fault.migrate(url)
            let database = FaultDatabase(url: url)
            try await database.installAudit()
            let users = 2000
            try await database.execute(Fault.seedSQL(count: users, zones: ["Asia/Kathmandu", "America/Havana"]))
            let dailyAt = try await Fault.dailyTime(database)
            let daemon = try Fault.start(
                url, dailyAt: dailyAt, name: "metricsd-standby",
                extra: [
                    "METRICSD_READ_DATABASE_URL": set.readURL, "METRICSD_READ_MAX_LAG_SECONDS": "\(Int(Self.bound))",
                    "METRICSD_TICK_SECONDS": "1",
                ])
            defer { daemon.signal(SIGKILL) }
            try await daemon.waitUntilReady()
            let done = await Fault.waitUntil(timeout: .seconds(90)) {
                try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
            }
            try #require(done != nil, "units not done:\n\(daemon.log.suffix(2000))")
            let (first, second) = (set.standbys[0], set.standbys[1])
            let bothInUse = await Fault.waitUntil(timeout: .seconds(30)) {
                try await Self.usable(daemon, [set.label(first), set.label(second)]) == [true, true]
            }
            try #require(bothInUse != nil, "the standbys were never used:\n\(daemon.log.suffix(2000))")
            let script = try Fault.wrkScript(users: Fault.validUserIDs(users, count: 300))

            // 1. Reads land on the standbys.
            let spread = try await Self.load(set, daemon: daemon, script: script, seconds: 6)
            let total = spread.rows.reduce(0, +)
            let shares = spread.rows.map { total > 0 ? Double($0) / Double(total) : 0 }
            print(
                "standby-reads: \(spread.wrk.summary); rows read by the latest-read statements (pg_stat_statements): primary \(spread.rows[0]), standby 1 \(spread.rows[1]), standby 2 \(spread.rows[2]); on the standbys \(Self.percent(shares[1] + shares[2]))"
            )
            #expect(spread.wrk.statuses.keys.sorted() == [200], "statuses: \(spread.wrk.statuses)")
            #expect(
                total >= spread.wrk.requests / 2,
                "the statements' rows (\(total)) do not account for the requests (\(spread.wrk.requests))")
            #expect(shares[1] >= 0.25 && shares[2] >= 0.25, "each standby serves a share: \(shares)")
            #expect(shares[0] <= 0.05, "the primary served \(Self.percent(shares[0])) of the reads")

            // 2. A settings change is visible within the bound of its commit.
            let change = try await Self.changeSettings(database, daemon: daemon, user: 7, weight: "77.25")
            print(
                "standby-settings: recomputed \(Fault.format(change.committed)) s after the change, visible \(Fault.format(change.visible)) s after that"
            )
            #expect(change.visible <= Self.bound + Self.slack, "visible \(change.visible) s after the commit")

            // 3. Replay paused on both standbys. Within the bound they are still read from: a user computed
            //    elsewhere since (a row on the primary only) is read on the primary, not computed again.
            try await set.pauseReplay(first)
            try await set.pauseReplay(second)
            let paused = ContinuousClock.now
            let elsewhere = try await Self.computedElsewhere(database, daemon: daemon, user: 900_001)
            let elsewhereSeconds = (ContinuousClock.now - paused).faultSeconds
            print(
                "standby-elsewhere: a user with a row on the primary only, read \(Fault.format(elsewhereSeconds)) s after the pause: \(elsewhere.fallbacks) read again on the primary, computedAt kept: \(elsewhere.kept), writes \(elsewhere.writes)"
            )
            #expect(elsewhere.kept && elsewhere.writes == 0, "the row computed elsewhere was computed again")
            #expect(
                elsewhere.fallbacks >= 1,
                "not read on a standby first (\(Fault.format(elsewhereSeconds)) s after the pause)")
            //    Then reads go to the primary and show fresh values.
            let fresh = try await Self.changeSettings(database, daemon: daemon, user: 11, weight: "66.5")
            let left = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(50)) {
                try await Self.usable(daemon, [set.label(first), set.label(second)]) == [false, false]
            }
            let leftSeconds = try #require(
                left.map { ($0 - paused).faultSeconds }, "paused standbys still in use:\n\(daemon.log.suffix(2000))")
            let lagging = try await Self.load(set, daemon: daemon, script: script, seconds: 3)
            print(
                "standby-paused: left \(Fault.format(leftSeconds)) s after the pause (bound \(Int(Self.bound)) s); a change recomputed then was visible \(Fault.format(fresh.visible)) s after its commit; rows read since: primary \(lagging.rows[0]), standbys \(lagging.rows[1]) and \(lagging.rows[2]); \(lagging.wrk.summary)"
            )
            #expect(fresh.visible <= Self.bound + Self.slack, "fresh values \(fresh.visible) s after the commit")
            #expect(leftSeconds <= Self.bound + 2, "left \(leftSeconds) s after the pause")
            #expect(lagging.rows[1] == 0 && lagging.rows[2] == 0, "paused standbys still read: \(lagging.rows)")
            #expect(lagging.rows[0] > 0 && lagging.wrk.statuses.keys.sorted() == [200], "\(lagging.wrk.statuses)")
            #expect(daemon.log.contains("Not reading from read server"), "no log line when a standby was left")
            try await set.resumeReplay(first)
            try await set.resumeReplay(second)
            let resumed = ContinuousClock.now
            let back = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(50)) {
                try await Self.usable(daemon, [set.label(first), set.label(second)]) == [true, true]
            }
            let backSeconds = try #require(
                back.map { ($0 - resumed).faultSeconds }, "standbys not used again:\n\(daemon.log.suffix(2000))")
            print("standby-paused: used again \(Fault.format(backSeconds)) s after replay resumed")

            // 4. A standby stopped under load: no failed request; used again once restarted.
            async let stoppedLoad = Fault.wrk(port: daemon.port, connections: 8, seconds: 8, script: script)
            try await Task.sleep(for: .seconds(2))
            try await second.stop()
            let stopped = ContinuousClock.now
            let gone = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(50)) {
                try await !Self.usable(daemon, set.label(second))
            }
            let goneSeconds = try #require(gone.map { ($0 - stopped).faultSeconds }, "a stopped standby still in use")
            let underStop = try await stoppedLoad
            #expect(
                underStop.statuses.keys.sorted() == [200],
                "requests failed while a standby stopped: \(underStop.statuses)")
            try await second.start()
            let restarted = ContinuousClock.now
            let again = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(50)) {
                try await Self.usable(daemon, set.label(second))
            }
            let againSeconds = try #require(
                again.map { ($0 - restarted).faultSeconds }, "restarted standby not used:\n\(daemon.log.suffix(2000))")
            let afterRestart = try await Self.load(set, daemon: daemon, script: script, seconds: 3)
            print(
                "standby-stopped: \(underStop.summary); left \(Fault.format(goneSeconds)) s after the stop, used again \(Fault.format(againSeconds)) s after the restart; rows read since: primary \(afterRestart.rows[0]), standbys \(afterRestart.rows[1]) and \(afterRestart.rows[2])"
            )
            #expect(goneSeconds <= Self.bound, "left \(goneSeconds) s after the stop")
            #expect(afterRestart.rows[2] > 0, "the restarted standby serves no reads: \(afterRestart.rows)")

            // 5. A just-onboarded user gets metrics on the first request, computed once.
            try await database.execute(
                """
                INSERT INTO users (id, timezone) VALUES (900002, 'Asia/Kathmandu');
                INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level,
                                           onboarding_completed)
                VALUES (900002, date '1990-04-01', 'female', 61.5, 168, 'lightly_active', true);
                """)
            let onboarded = try await API.today(port: daemon.port, user: 900_002)
            #expect(onboarded.status == 200, "\(onboarded)")
            try await Task.sleep(for: .seconds(2))  // the settings listener's turn: it must find the row current
            let again2 = try await API.today(port: daemon.port, user: 900_002)
            #expect(
                again2.status == 200 && again2.json?["data"]?["metrics"] == onboarded.json?["data"]?["metrics"],
                "\(again2)")
            let onboardedWrites = try await database.int("SELECT count(*) FROM fault_audit WHERE user_id = 900002")
            print("standby-onboarded: first request \(onboarded.status), rows written \(onboardedWrites)")
            #expect(onboardedWrites == 1, "a just-onboarded user was written \(onboardedWrites) times")

            // 6. Acknowledgement after a recompute: the acknowledgement of the row a read showed before the
            //    recompute is refused (the primary decides); the new row, once read, is acknowledged.
            try await Self.acknowledgeAfterRecompute(database, daemon: daemon, user: 13)

            // 7. metricsd status lists each read server, its lag and its share of reads (the next heartbeat).
            let listed = await Fault.waitUntil(timeout: .seconds(25), poll: .seconds(1)) {
                let status = try await Subprocess.run(
                    try DaemonProcess.binary(), ["status"],
                    environment: [
                        "DATABASE_URL": url, "METRICSD_ENV_FILE": "-/nonexistent", "METRICSD_CREDSTORE": "/nonexistent",
                    ])
                return status.output.contains(set.label(first)) && status.output.contains(set.label(second))
                    && status.output.contains("in use") && status.output.contains("SHARE")
            }
            #expect(listed != nil, "metricsd status does not show the read servers")
            //    check-config reaches each read server and measures how long it takes to replay the primary's position.
            let check = try await Subprocess.capture(
                try DaemonProcess.binary(), ["check-config"],
                environment: [
                    "DATABASE_URL": url, "METRICSD_READ_DATABASE_URL": set.readURL,
                    "METRICSD_LISTEN": "127.0.0.1:\(DaemonProcess.freePort())",
                    "METRICSD_JWT_SECRET_FILE": DaemonProcess.secrets.directory + "/jwt-secret",
                    "METRICSD_ENV_FILE": "-/nonexistent", "METRICSD_CREDSTORE": "/nonexistent",
                ])
            #expect(check.status == 0, "\(check.stdout)\n\(check.stderr)")
            for standby in set.standbys {
                #expect(
                    check.stdout.contains(
                        "  read server:  \(set.label(standby)): standby, schema current; replayed the primary's present position within "
                    ),
                    "\(check.stdout)")
            }
            #expect(daemon.process.isRunning)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
        }
        print("standby-reads: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: Tools

    /// Rows returned by the latest-read statements on a server since it started (`pg_stat_statements`): the
    /// statements that read `profile_metrics_latest` with the matching acknowledgement beside it.
    static func latestRows(_ member: ThrowawayCluster) async throws -> Int {
        Int(
            try await member.value(
                """
                SELECT coalesce(sum(rows), 0) FROM pg_stat_statements
                WHERE query LIKE '%profile_metrics_latest%' AND query LIKE '%LEFT JOIN metrics_acknowledgements a%'
                  AND query NOT LIKE '%pg_stat_statements%'
                """)) ?? -1
    }

    /// A wrk run of latest reads, and the rows the latest-read statements returned on each server meanwhile
    /// (primary first).
    static func load(_ set: StandbySet, daemon: DaemonProcess, script: String, seconds: Int) async throws -> (
        wrk: Fault.WrkResult, rows: [Int]
    ) {
        let members = [set.primary] + set.standbys
        var before: [Int] = []
        for member in members { before.append(try await Self.latestRows(member)) }
        let result = try await Fault.wrk(port: daemon.port, connections: 8, seconds: seconds, script: script)
        var rows: [Int] = []
        for (member, was) in zip(members, before) { rows.append(try await Self.latestRows(member) - was) }
        return (result, rows)
    }

    /// Whether the daemon reads from `server` now (its `/metrics`).
    static func usable(_ daemon: DaemonProcess, _ server: String) async throws -> Bool {
        try await Self.usable(daemon, [server]) == [true]
    }

    /// Whether the daemon reads from each of `servers` now, from one scrape.
    static func usable(_ daemon: DaemonProcess, _ servers: [String]) async throws -> [Bool] {
        let series = try await PrometheusScrape.scrape(daemon)
        return servers.map { PrometheusScrape.value(series, "metricsd_read_server_usable", ["server": $0]) == 1 }
    }

    static func computedAt(_ reply: APIReply) -> Int64? {
        reply.json?["data"]?["metrics"]?["computedAt"]?.string.flatMap { Timestamp(iso8601: $0) }?
            .millisecondsSinceEpoch
    }

    /// The primary's newest row of `user`: computed_at in epoch milliseconds, as the API shows it.
    static func primaryComputedAt(_ database: FaultDatabase, user: Int64) async throws -> Int64? {
        try await database.value(
            "SELECT (extract(epoch FROM computed_at) * 1000)::bigint FROM profile_metrics WHERE user_id = $1 ORDER BY computed_at DESC LIMIT 1",
            [String(user)]
        ).flatMap { Int64($0) }
    }

    /// Changes `user`'s weight, waits for the daemon to recompute the row on the primary, then reads until the API
    /// shows it: seconds from the change to the commit seen on the primary, and from there to the API showing it.
    static func changeSettings(_ database: FaultDatabase, daemon: DaemonProcess, user: Int64, weight: String)
        async throws -> (
            committed: Double, visible: Double
        )
    {
        let before = try await Self.primaryComputedAt(database, user: user)
        let changed = ContinuousClock.now
        try await database.execute("UPDATE user_settings SET current_weight = \(weight) WHERE user_id = \(user)")
        var after: Int64?
        let committed = await Fault.waitUntil(timeout: .seconds(15), poll: .milliseconds(50)) {
            after = try await Self.primaryComputedAt(database, user: user)
            return after != before
        }
        let committedAt = try #require(committed, "user \(user) not recomputed:\n\(daemon.log.suffix(2000))")
        let visible = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(50)) {
            Self.computedAt(try await API.today(port: daemon.port, user: user)) == after
        }
        let visibleAt = try #require(visible, "the recomputed row of user \(user) never read")
        return ((committedAt - changed).faultSeconds, (visibleAt - committedAt).faultSeconds)
    }

    /// A user whose settings and row were written on the primary by someone else (no trigger: as another instance
    /// would have computed them) and read at once: (the row read is that one, rows metricsd wrote for the user,
    /// users the daemon read again on the primary because a read server lacked them).
    static func computedElsewhere(_ database: FaultDatabase, daemon: DaemonProcess, user: Int64) async throws -> (
        kept: Bool, writes: Int, fallbacks: Int
    ) {
        let before =
            PrometheusScrape.value(
                try await PrometheusScrape.scrape(daemon), "metricsd_read_fallbacks_total", ["reason": "missing"]) ?? 0
        try await database.execute(
            """
            SET session_replication_role = replica;
            INSERT INTO users (id, timezone) VALUES (\(user), 'Asia/Kathmandu');
            INSERT INTO user_settings (user_id, date_of_birth, gender, current_weight, height, activity_level,
                                       onboarding_completed, updated_at)
            VALUES (\(user), date '1985-02-03', 'male', 80, 180, 'sedentary', true, now() - interval '1 minute');
            INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
            VALUES (\(user), 24.7, 1760, 2112, 1, (now() AT TIME ZONE 'Asia/Kathmandu')::date, date_trunc('milliseconds', now()));
            SET session_replication_role = DEFAULT;
            """)
        let stored = try await Self.primaryComputedAt(database, user: user)
        let reply = try await API.today(port: daemon.port, user: user)
        let after =
            PrometheusScrape.value(
                try await PrometheusScrape.scrape(daemon), "metricsd_read_fallbacks_total", ["reason": "missing"]) ?? 0
        let writes = try await database.int("SELECT count(*) FROM fault_audit WHERE user_id = \(user)")
        return (reply.status == 200 && Self.computedAt(reply) == stored, writes, Int(after - before))
    }

    /// Reads `user`'s row, has it recomputed, acknowledges the row read before (refused: not the current one),
    /// then reads until the new row shows and acknowledges it, and reads until the acknowledgement shows.
    static func acknowledgeAfterRecompute(_ database: FaultDatabase, daemon: DaemonProcess, user: Int64) async throws {
        let old = try await API.today(port: daemon.port, user: user)
        let oldAt = try #require(old.json?["data"]?["metrics"]?["computedAt"]?.string, "\(old)")
        let version = Int(old.json?["data"]?["metrics"]?["version"]?.int ?? 1)
        let change = try await Self.changeSettings(database, daemon: daemon, user: user, weight: "70.75")
        let stale = try await API.acknowledge(port: daemon.port, user: user, version: version, computedAt: oldAt)
        #expect(
            stale.status == 404 && stale.text.contains("updated"),
            "acknowledging the row before the recompute: \(stale)")
        let current = try await API.today(port: daemon.port, user: user)
        let newAt = try #require(current.json?["data"]?["metrics"]?["computedAt"]?.string, "\(current)")
        #expect(newAt != oldAt)
        let acknowledged = try await API.acknowledge(port: daemon.port, user: user, version: version, computedAt: newAt)
        #expect(acknowledged.status == 200, "\(acknowledged)")
        let acked = ContinuousClock.now
        let shown = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(50)) {
            try await API.today(port: daemon.port, user: user).json?["data"]?["acknowledged"]?.bool == true
        }
        let shownSeconds = try #require(shown.map { ($0 - acked).faultSeconds }, "the acknowledgement never showed")
        print(
            "standby-acknowledge: the old row's acknowledgement \(stale.status), the new row (visible \(Fault.format(change.visible)) s after its commit) acknowledged \(acknowledged.status), shown \(Fault.format(shownSeconds)) s later"
        )
        #expect(shownSeconds <= Self.bound + Self.slack, "the acknowledgement showed \(shownSeconds) s later")
    }

    static func percent(_ share: Double) -> String { String(format: "%.1f%%", share * 100) }
}
