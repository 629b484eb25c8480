import Foundation
import MetricsdTestSupport
import Testing

/// The real `metricsd` binary reading from servers that do not follow its primary: a separate cluster, a standby
/// promoted by mistake, an old primary started again after a failover, each at a higher WAL position than the
/// primary (so that positions alone call it current). Each is left — `metricsd_read_server_usable 0`, the reason
/// in `metricsd_read_server_problem`, the log and `metricsd status` — and no read shows its rows. And the
/// switchover an operator does under Patroni: the standby the daemon reads from is promoted and becomes the primary
/// `DATABASE_URL` follows; with `target_session_attrs=standby` it is left for reads within the bound, and the old
/// primary, once a standby of the new one, is read from again. Each case prints its figures.
@Suite(.serialized) struct ReadServerIdentityTests {
    static let bound = 2.0
    /// The BMI the rows of the servers that must not be read say; the primary's rows never do (heights 150–210 cm,
    /// weights 45–125 kg).
    static let wrongBMI = 11.1

    @Test(.timeLimit(.minutes(6))) func serversFollowingAnotherPrimaryAreLeft() async throws {
        let started = ContinuousClock.now
        try await withStandbySet("identity", standbys: 2) { set in
            try await withThrowawayCluster("identity-other") { other in
                try await other.start()
                let users = 300
                for url in [set.primaryURL, other.url] {
                    try await Fault.migrate(url)
                    try await FaultDatabase(url: url).execute(
                        Fault.seedSQL(count: users, zones: ["Asia/Kathmandu", "America/Havana"]))
                }
                // The other cluster holds a row for every user, all wrong, and is further along in its WAL.
                try await FaultDatabase(url: other.url).execute(Self.wrongRowsSQL(users: users))
                try await Self.advanceWAL(of: other, past: set.primary)
                let (first, second) = (set.standbys[0], set.standbys[1])
                let labels = (first: set.label(first), second: set.label(second), other: "127.0.0.1:\(other.port)")
                let readURL =
                    "postgresql://postgres@127.0.0.1:\(first.port),127.0.0.1:\(second.port),127.0.0.1:\(other.port)/postgres?sslmode=disable&connect_timeout=2"
                let daemon = try await FrozenServerTests.startDaemon(
                    set.primaryURL, name: "metricsd-identity",
                    extra: [
                        "METRICSD_READ_DATABASE_URL": readURL, "METRICSD_READ_MAX_LAG_SECONDS": "\(Int(Self.bound))",
                    ])
                defer { daemon.signal(SIGKILL) }
                let bothInUse = await Fault.waitUntil(timeout: .seconds(30)) {
                    try await StandbyReadTests.usable(daemon, [labels.first, labels.second]) == [true, true]
                }
                try #require(bothInUse != nil, "the standbys were never used:\n\(daemon.log.suffix(2000))")

                // 1. Another cluster: never used, its rows never shown.
                let otherUsed = await Self.everUsable(daemon, labels.other, for: .seconds(6))
                let otherReads = try await Self.wrongReads(daemon, users: users, count: 60)
                let otherProblem = try await Self.problem(daemon, labels.other, "other_cluster")
                print(
                    "identity-other: another cluster at a higher WAL position, listed among the read servers: usable at any sample in 6 s: \(otherUsed); reads showing its rows: \(otherReads) of 60"
                )
                #expect(!otherUsed, "the other cluster was used for reads")
                #expect(otherReads == 0, "\(otherReads) reads showed the other cluster's rows")
                #expect(
                    otherProblem == 1,
                    "metricsd_read_server_problem{reason=\"other_cluster\"}: \(otherProblem.map { "\($0)" } ?? "absent")"
                )

                // 2. A standby promoted by mistake: left within the bound; then given wrong rows and a higher
                //    position, it is not read from.
                try await second.run("promote", second.directory)
                let promoted = ContinuousClock.now
                let left = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(50)) {
                    try await !StandbyReadTests.usable(daemon, labels.second)
                }
                let leftSeconds = try #require(
                    left.map { ($0 - promoted).faultSeconds },
                    "the promoted standby is still used:\n\(daemon.log.suffix(3000))")
                _ = try await second.value("UPDATE profile_metrics SET bmi = \(Self.wrongBMI)")
                try await Self.advanceWAL(of: second, past: set.primary)
                let promotedUsed = await Self.everUsable(daemon, labels.second, for: .seconds(4))
                let promotedReads = try await Self.wrongReads(daemon, users: users, count: 60)
                let promotedProblem = try await Self.problem(daemon, labels.second, "other_primary")
                print(
                    "identity-promoted: a standby promoted by mistake left \(Fault.format(leftSeconds)) s after its promotion (bound \(Int(Self.bound)) s); given wrong rows and a higher position then, used again in the next 4 s: \(promotedUsed); reads showing its rows: \(promotedReads) of 60"
                )
                #expect(leftSeconds <= Self.bound + 1, "left \(leftSeconds) s after the promotion")
                #expect(!promotedUsed, "the promoted standby was used again")
                #expect(promotedReads == 0, "\(promotedReads) reads showed the promoted standby's rows")
                #expect(
                    promotedProblem == 1,
                    "metricsd_read_server_problem{reason=\"other_primary\"}: \(promotedProblem.map { "\($0)" } ?? "absent")"
                )
                #expect(
                    try await StandbyReadTests.usable(daemon, labels.first),
                    "the standby that follows the primary was left")

                // 3. Said where an operator looks: the log and metricsd status (the next heartbeat).
                #expect(daemon.log.contains("another cluster: system identifier"), "\(daemon.log.suffix(2000))")
                #expect(daemon.log.contains("a primary that is not DATABASE_URL's"), "\(daemon.log.suffix(2000))")
                var status = ""
                let listed = await Fault.waitUntil(timeout: .seconds(25), poll: .seconds(1)) {
                    status = try await FrozenServerTests.status(set.primaryURL)
                    return status.contains("another cluster") && status.contains("not DATABASE_URL's")
                }
                #expect(listed != nil, "metricsd status does not say why:\n\(status)")
                //    And check-config, which reaches each read server as the daemon does.
                let check = try await Subprocess.capture(
                    try DaemonProcess.binary(), ["check-config"],
                    environment: [
                        "DATABASE_URL": set.primaryURL, "METRICSD_READ_DATABASE_URL": readURL,
                        "METRICSD_LISTEN": "127.0.0.1:\(DaemonProcess.freePort())",
                        "METRICSD_JWT_SECRET_FILE": DaemonProcess.secrets.directory + "/jwt-secret",
                        "METRICSD_ENV_FILE": "-/nonexistent", "METRICSD_CREDSTORE": "/nonexistent",
                    ])
                let said = check.stdout + check.stderr
                #expect(check.status != 0, "check-config passed:\n\(said)")
                #expect(said.contains("\(labels.other): not read from: another cluster"), "\(said)")
                #expect(
                    said.contains("\(labels.second): not read from: a primary that is not DATABASE_URL's"), "\(said)")
                #expect(said.contains("\(labels.first): standby, schema current"), "\(said)")
                daemon.signal(SIGTERM)
                #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
            }
        }
        print("identity: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    /// A Patroni-style switchover under reads: `DATABASE_URL` lists both members with
    /// `target_session_attrs=read-write`, the read URL both members with `target_session_attrs=standby`. The
    /// standby the daemon reads from is promoted (the old primary stopped first): it is left for reads within the
    /// bound and not read from again; the old primary started alone (a primary on the old timeline) is not read
    /// from; once it is a standby of the new primary, reads go to it again.
    @Test(.timeLimit(.minutes(6))) func promotedStandbyLeftAndOldPrimaryTakenBack() async throws {
        let started = ContinuousClock.now
        try await withStandbySet("switchover", standbys: 1) { set in
            let (old, new) = (set.primary, set.standbys[0])
            let users = 300
            try await Fault.migrate(set.primaryURL)
            try await FaultDatabase(url: set.primaryURL).execute(
                Fault.seedSQL(count: users, zones: ["Asia/Kathmandu", "America/Havana"]))
            // The member that becomes the primary first: libpq takes the first read-write host.
            let url =
                "postgresql://postgres@127.0.0.1:\(new.port),127.0.0.1:\(old.port)/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
            let readURL =
                "postgresql://postgres@127.0.0.1:\(old.port),127.0.0.1:\(new.port)/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=standby"
            let (oldLabel, newLabel) = (set.label(old), set.label(new))
            let daemon = try await FrozenServerTests.startDaemon(
                url, direct: set.primaryURL, name: "metricsd-switchover",
                extra: [
                    "METRICSD_READ_DATABASE_URL": readURL, "METRICSD_READ_MAX_LAG_SECONDS": "\(Int(Self.bound))",
                    "METRICSD_DB_STATEMENT_DEADLINE_SECONDS": "10",
                ])
            defer { daemon.signal(SIGKILL) }
            let inUse = await Fault.waitUntil(timeout: .seconds(30)) {
                try await StandbyReadTests.usable(daemon, [oldLabel, newLabel]) == [false, true]
            }
            try #require(inUse != nil, "the standby was never used:\n\(daemon.log.suffix(2000))")
            #expect(
                try await Self.problem(daemon, oldLabel, "primary_not_wanted") == 1,
                "the primary, not wanted for reads, is not said so")
            let script = try Fault.wrkScript(users: Fault.validUserIDs(users, count: 100))

            // The switchover, under reads.
            async let load = Fault.wrk(port: daemon.port, connections: 4, seconds: 14, script: script)
            try await Task.sleep(for: .seconds(2))
            let before = try await Self.reads(daemon, newLabel)
            try await old.stop()
            try await new.run("promote", new.directory)
            let promoted = ContinuousClock.now
            let left = await Fault.waitUntil(timeout: .seconds(20), poll: .milliseconds(50)) {
                try await !StandbyReadTests.usable(daemon, newLabel)
            }
            let leftSeconds = try #require(
                left.map { ($0 - promoted).faultSeconds },
                "the promoted member still takes standby reads:\n\(daemon.log.suffix(3000))")
            try await Task.sleep(for: .milliseconds(500))
            let settled = try await Self.reads(daemon, newLabel)
            try await Task.sleep(for: .seconds(5))
            let later = try await Self.reads(daemon, newLabel)
            let primaryShare = try await Self.reads(daemon, "primary")
            let result = try await load
            print(
                "switchover: \(result.summary); the promoted member was left for reads \(Fault.format(leftSeconds)) s after its promotion (bound \(Int(Self.bound)) s); its standby reads: \(settled - before) from 2 s before the switchover until then, \(later - settled) in the 5 s after; primary reads \(primaryShare)"
            )
            #expect(leftSeconds <= Self.bound + 1, "left \(leftSeconds) s after the promotion")
            #expect(later == settled, "the promoted member took \(later - settled) standby reads after it was left")
            #expect((result.statuses[200] ?? 0) > 0)

            // The old primary comes back alone: a primary on the old timeline; never read from.
            try await old.start()
            let oldUsed = await Self.everUsable(daemon, oldLabel, for: .seconds(5))
            let oldProblem = try await Self.problem(daemon, oldLabel, "other_primary")
            print("switchover: the old primary started alone: read from at any sample in 5 s: \(oldUsed)")
            #expect(!oldUsed, "the old primary, alone on its timeline, was read from")
            #expect(
                oldProblem == 1,
                "metricsd_read_server_problem{server=old, reason=\"other_primary\"}: \(oldProblem.map { "\($0)" } ?? "absent")"
            )

            // Then it rejoins as a standby of the new primary: read from again.
            try await old.stop()
            try await old.run("standby", old.directory, String(old.port), new.directory, "async")
            let rejoined = ContinuousClock.now
            let back = await Fault.waitUntil(timeout: .seconds(30), poll: .milliseconds(100)) {
                try await StandbyReadTests.usable(daemon, oldLabel)
            }
            let backSeconds = try #require(
                back.map { ($0 - rejoined).faultSeconds },
                "the rejoined old primary is not read from:\n\(daemon.log.suffix(3000))")
            let oldBefore = try await Self.reads(daemon, oldLabel)
            let newBefore = try await Self.reads(daemon, newLabel)
            let after = try await Fault.wrk(port: daemon.port, connections: 4, seconds: 4, script: script)
            let oldReads = try await Self.reads(daemon, oldLabel) - oldBefore
            let newReads = try await Self.reads(daemon, newLabel) - newBefore
            print(
                "switchover: the old primary, a standby again, read from \(Fault.format(backSeconds)) s after it rejoined; then \(after.summary): standby reads on it \(oldReads), on the new primary \(newReads)"
            )
            #expect(oldReads > 0, "no reads on the rejoined standby")
            #expect(newReads == 0, "the new primary took \(newReads) standby reads")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0, "\(daemon.log.suffix(2000))")
        }
        print("switchover: took \(Fault.format((ContinuousClock.now - started).faultSeconds)) s")
    }

    // MARK: Tools

    /// A row with ``wrongBMI`` for each of `users`, dated today in their zone, computed now.
    static func wrongRowsSQL(users: Int) -> String {
        """
        INSERT INTO profile_metrics (user_id, bmi, bmr, tdee, version, metrics_date, computed_at)
        SELECT u.id, \(Self.wrongBMI), 1000, 1200, 1, (now() AT TIME ZONE u.timezone)::date, date_trunc('milliseconds', now())
        FROM users u WHERE u.id <= \(users);
        """
    }

    /// Switches WAL files on `server` until its WAL position is 64 MB past `primary`'s.
    static func advanceWAL(of server: ThrowawayCluster, past primary: ThrowawayCluster) async throws {
        let target = Int(try await primary.value("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")) ?? 0
        for _ in 0..<64 {
            let position = Int(try await server.value("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")) ?? 0
            if position > target + 64 << 20 { return }
            _ = try await server.value(
                "CREATE TABLE IF NOT EXISTS wal_filler (n int); INSERT INTO wal_filler VALUES (1); SELECT pg_switch_wal()"
            )
        }
        Issue.record("the WAL position of \(server.directory) did not pass the primary's")
    }

    /// Whether the daemon's `/metrics` showed `server` usable at any sample (every 100 ms) for `duration`.
    static func everUsable(_ daemon: DaemonProcess, _ server: String, for duration: Duration) async -> Bool {
        let end = ContinuousClock.now + duration
        while ContinuousClock.now < end {
            if (try? await StandbyReadTests.usable(daemon, server)) == true { return true }
            try? await Task.sleep(for: .milliseconds(100))
        }
        return false
    }

    /// Of `count` latest reads (users round robin), how many showed ``wrongBMI``.
    static func wrongReads(_ daemon: DaemonProcess, users: Int, count: Int) async throws -> Int {
        var wrong = 0
        for user in Fault.validUserIDs(users, count: count) {
            let reply = try await API.today(port: daemon.port, user: user)
            if case .number(let bmi)? = reply.json?["data"]?["metrics"]?["bmi"], abs(bmi - Self.wrongBMI) < 0.01 {
                wrong += 1
            }
        }
        return wrong
    }

    /// `metricsd_read_server_problem{server, reason}` now.
    static func problem(_ daemon: DaemonProcess, _ server: String, _ reason: String) async throws -> Double? {
        PrometheusScrape.value(
            try await PrometheusScrape.scrape(daemon), "metricsd_read_server_problem",
            ["server": server, "reason": reason])
    }

    /// `metricsd_read_server_reads_total{server}` now.
    static func reads(_ daemon: DaemonProcess, _ server: String) async throws -> Int {
        Int(
            PrometheusScrape.value(
                try await PrometheusScrape.scrape(daemon), "metricsd_read_server_reads_total", ["server": server]) ?? 0)
    }
}
