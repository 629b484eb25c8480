import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdPostgres
import MetricsdTestSupport
import Synchronization
import Testing

/// The real binary under Patroni (etcd, two members, `synchronous_mode`) with HAProxy in front, as
/// `scripts/ha-cluster` runs them: writes through HAProxy's primary port, standby reads from the member list with
/// `target_session_attrs=standby`. A `patronictl switchover` in the middle of a daily unit, then a killed leader in
/// the middle of a recompute job that `recompute-all --wait` follows: no row lost or written twice, the same two
/// daemon processes throughout each (version 1's for the unit, version 2's for the job), reads failing only inside
/// the transition, and the waiting command exiting 0. Then the killed member started again: once it streams, the
/// standby reads are back on it and none on the leader.
@Suite(.serialized) struct PatroniTests {
    @Test(.timeLimit(.minutes(8))) func switchoverDuringADailyUnitAndAKilledLeaderDuringRecompute() async throws {
        let cluster = try await PatroniCluster.create("patroni")
        do {
            try await Self.scenario(cluster)
            await cluster.destroy()
        } catch {
            await cluster.destroy()
            throw error
        }
    }

    static func scenario(_ cluster: PatroniCluster) async throws {
        let primary = try await cluster.url("primary", database: "postgres")
        try await FaultDatabase(url: primary).execute("CREATE DATABASE metricsd")
        let url = try await cluster.url("primary", database: "metricsd")
        // Its own application_name, so that each member's pg_stat_activity tells the read sessions apart.
        let members =
            try await cluster.url("members", database: "metricsd")
            + "&target_session_attrs=standby&application_name=metricsd-reads"
        try await Fault.migrate(url)
        let database = FaultDatabase(url: url)
        try await database.installAudit()
        try await database.execute(Fault.seedSQL(count: 6000, zones: ["Asia/Kathmandu", "America/Havana"]))
        let dailyAt = try await Fault.dailyTime(database)
        try await Fault.leaveVersion2ToTheJob(database, zones: ["Asia/Kathmandu", "America/Havana"])
        let extra = [
            "METRICSD_READ_DATABASE_URL": members, "METRICSD_LEASE_SECONDS": "6", "METRICSD_TICK_SECONDS": "1",
            "METRICSD_CHUNK_SIZE": "1000", "METRICSD_BATCH_SIZE": "100", "METRICSD_FAULTS": "batch-delay-ms=100",
            "METRICSD_WORKERS": "2", "METRICSD_DB_STATEMENT_DEADLINE_SECONDS": "5",
        ]
        let daemons = try (0..<2).map { _ in try Fault.start(url, dailyAt: dailyAt, extra: extra) }
        defer { for daemon in daemons { daemon.signal(SIGKILL) } }
        for daemon in daemons { try await daemon.waitUntilReady() }
        let pids = daemons.map(\.pid)

        // 1. A switchover in the middle of the daily unit, under reads.
        let midway = await Fault.waitUntil(timeout: .seconds(60)) {
            try await database.int("SELECT count(*) FROM profile_metrics") >= 1000
        }
        try #require(midway != nil, "the unit did not get under way:\n\(daemons[0].log.suffix(2000))")
        let reads = ReadLoad(daemons: daemons, users: Fault.validUserIDs(6000, count: 200))
        let switched = try await cluster.run("switchover")
        print("patroni: switchover to \(switched.trimmingCharacters(in: .whitespacesAndNewlines))")
        let done = await Fault.waitUntil(timeout: .seconds(120)) {
            try await database.int("SELECT count(*) FROM daily_units WHERE state = 'done' AND version = 1") == 2
        }
        #expect(done != nil, "units not done:\n\(daemons[0].log.suffix(2000))")
        let switchoverReads = await reads.stop()
        print("patroni: switchover: \(switchoverReads)")
        #expect(switchoverReads.ok > 0)
        #expect(switchoverReads.failureWindow < 25, "reads failed for \(switchoverReads.failureWindow) s")
        try await Invariant.check(database, scenario: "patroni-switchover-daily", faults: 1, dailyVersion: 1)
            .assertHolds()

        #expect(daemons.map(\.pid) == pids && daemons.allSatisfy { kill($0.pid, 0) == 0 }, "a daemon exited")
        for daemon in daemons { daemon.signal(SIGTERM) }
        for daemon in daemons { #expect(await daemon.waitForExit() == 0) }

        // 2. The leader killed in the middle of a recompute job (formula version 2, run by two daemons of that
        // version) that `recompute-all --wait` follows.
        _ = try await cluster.run("wait-members", "--timeout", "90")
        var extra2 = extra
        extra2["METRICSD_TEST_FORMULA_VERSION"] = "2"
        let workers = try (0..<2).map { _ in try Fault.start(url, dailyAt: dailyAt, extra: extra2) }
        defer { for daemon in workers { daemon.signal(SIGKILL) } }
        for daemon in workers { try await daemon.waitUntilReady() }
        let workerPIDs = workers.map(\.pid)
        let cli = try DaemonProcess(
            arguments: ["recompute-all", "--wait"],
            environment: ["DATABASE_URL": url, "METRICSD_TEST_FORMULA_VERSION": "2", "METRICSD_CHUNK_SIZE": "1000"])
        defer { cli.signal(SIGKILL) }
        let recomputing = await Fault.waitUntil(timeout: .seconds(60)) {
            try await database.int("SELECT count(*) FROM profile_metrics WHERE version = 2") >= 1000
        }
        try #require(recomputing != nil, "the job did not get under way:\n\(cli.log)")
        // The old leader, a replica again since the switchover, must be the synchronous standby Patroni may
        // promote: with synchronous_mode, killing the leader before that leaves no leader at all.
        try await cluster.run("wait-members", "--timeout", "60")
        let reads2 = ReadLoad(daemons: workers, users: Fault.validUserIDs(6000, count: 200))
        let readiness = Self.watchReadiness(workers[0])
        let killed = try await cluster.run("kill-leader")
        let killedAt = ContinuousClock.now
        let leader = try await cluster.run(
            "wait-leader", "--not", killed.trimmingCharacters(in: .whitespacesAndNewlines), "--timeout", "60")
        let ledAt = ContinuousClock.now
        print(
            "patroni: \(killed.trimmingCharacters(in: .whitespacesAndNewlines)) killed; \(leader.trimmingCharacters(in: .whitespacesAndNewlines)) leads \(ledAt - killedAt) later"
        )
        // /readyz truthful: 503 while no leader takes writes, 200 again once one does (within the pool's reconnect).
        let readyAgain = await DaemonProcess.eventually(timeout: .seconds(30)) {
            (try? await workers[0].request("/readyz").status) == .ok
        }
        readiness.cancel()
        let answers = await readiness.value
        let unready = answers.filter { $0.status != 200 }.map { ($0.at - killedAt).faultSeconds }
        print(
            "patroni: /readyz \(answers.count) answers, \(unready.count) not 200, from \(unready.first.map { String(format: "%.1f", $0) } ?? "-") to \(unready.last.map { String(format: "%.1f", $0) } ?? "-") s after the kill; leader at \(String(format: "%.1f", (ledAt - killedAt).faultSeconds)) s"
        )
        #expect(readyAgain, "/readyz not 200 after the new leader:\n\(workers[0].log.suffix(2000))")
        #expect(!unready.isEmpty, "/readyz said 200 throughout while no primary answered")
        #expect(
            (unready.last ?? 0) <= (ledAt - killedAt).faultSeconds + 10,
            "/readyz not 200 until \(unready.last ?? 0) s after the kill")
        let status = await cli.waitForExit(timeout: .seconds(180))
        #expect(status == 0, "recompute-all --wait:\n\(cli.log)")
        #expect(cli.log.contains("waiting for the database"), "\(cli.log)")
        let killReads = await reads2.stop()
        print("patroni: kill-leader: \(killReads)")
        #expect(killReads.failureWindow < 30, "reads failed for \(killReads.failureWindow) s")
        #expect(workers.map(\.pid) == workerPIDs && workers.allSatisfy { kill($0.pid, 0) == 0 }, "a daemon exited")
        try await Invariant.check(database, scenario: "patroni-kill-leader-recompute", faults: 2, dailyVersion: 1)
            .assertHolds()

        // 3. The killed leader started again: Patroni rewinds it into a replica, and once it streams the daemons'
        // standby reads go to it again, and none to the leader.
        try await Self.rejoin(cluster, killed: killed, leader: leader, daemons: workers)
        #expect(workers.map(\.pid) == workerPIDs && workers.allSatisfy { kill($0.pid, 0) == 0 }, "a daemon exited")
        for daemon in workers { daemon.signal(SIGTERM) }
        for daemon in workers { #expect(await daemon.waitForExit() == 0) }
    }
}

extension PatroniTests {
    /// Restarts the killed member, waits until it streams, then: each daemon's read server is usable again within
    /// its read bound and probe, a burst of reads is answered with none by the primary, and the rejoined member
    /// holds the daemons' read sessions while the leader holds none.
    static func rejoin(_ cluster: PatroniCluster, killed: String, leader: String, daemons: [DaemonProcess]) async throws
    {
        let killedName = killed.trimmingCharacters(in: .whitespacesAndNewlines)
        let leaderName = leader.trimmingCharacters(in: .whitespacesAndNewlines)
        let restarted = ContinuousClock.now
        try await cluster.run("restart-member", killedName)
        try await cluster.run("wait-members", "--timeout", "120")
        let streaming = ContinuousClock.now - restarted
        let rejoinedURL = try await cluster.url(killedName, database: "metricsd")
        let leaderURL = try await cluster.url(leaderName, database: "metricsd")
        // The member list is one read server per host, each labelled by its address.
        let rejoinedServer = try #require(Self.address(rejoinedURL))
        let leaderServer = try #require(Self.address(leaderURL))
        let usable = await Fault.waitUntil(timeout: .seconds(60)) {
            for daemon in daemons {
                let series = try await PrometheusScrape.scrape(daemon)
                guard PrometheusScrape.value(series, "metricsd_read_server_usable", ["server": rejoinedServer]) == 1
                else { return false }
            }
            return true
        }
        print(
            "patroni: \(killedName) streaming \(streaming) after its restart; reads back on it \(usable.map { $0 - restarted } ?? .zero) after the restart"
        )
        try #require(
            usable != nil, "a daemon does not read from \(rejoinedServer) again:\n\(daemons[0].log.suffix(2000))")

        let burst = try await cluster.run("psql", leaderName, "metricsd", "-Atc", "SELECT now()").trimmingCharacters(
            in: .whitespacesAndNewlines)
        let before = try await daemons.asyncMap { try await PrometheusScrape.scrape($0) }
        let users = Fault.validUserIDs(6000, count: 100)
        for (index, user) in users.enumerated() {
            let reply = try await daemons[index % daemons.count].request(
                "/v1/profile/metrics/today", headers: TestTokens.bearer(TestTokens.user(user)))
            #expect(reply.status == .ok, "user \(user): \(reply.status) \(reply.text.prefix(200))")
        }
        let after = try await daemons.asyncMap { try await PrometheusScrape.scrape($0) }
        for (old, new) in zip(before, after) {
            let reads = { (server: String) in
                (PrometheusScrape.value(new, "metricsd_read_server_reads_total", ["server": server]) ?? 0)
                    - (PrometheusScrape.value(old, "metricsd_read_server_reads_total", ["server": server]) ?? 0)
            }
            #expect(PrometheusScrape.value(new, "metricsd_read_server_usable", ["server": leaderServer]) == 0)
            #expect(
                reads("primary") == 0 && reads(leaderServer) == 0 && reads(rejoinedServer) > 0,
                "reads by the primary \(reads("primary")), the leader \(reads(leaderServer)), the rejoined member \(reads(rejoinedServer))"
            )
        }
        // On each member itself (psql: a standby refuses the test's own database handle, which wants a primary):
        // the daemons' read sessions, and those that ran the latest read since the burst began.
        let sessions = """
            SELECT count(*) || ' ' || count(*) FILTER (WHERE query LIKE '%profile_metrics_latest%' AND state_change >= '\(burst)')
            FROM pg_stat_activity WHERE application_name = 'metricsd-reads' AND backend_type = 'client backend'
            """
        let count = { (member: String) in
            try await cluster.run("psql", member, "metricsd", "-Atc", sessions).split(separator: " ").compactMap {
                Int($0.trimmingCharacters(in: .whitespacesAndNewlines))
            }
        }
        let onRejoined = try await count(killedName)
        let onLeader = try await count(leaderName)
        print(
            "patroni: read sessions (all, reading since the burst) on the rejoined \(killedName) \(onRejoined), on the leader \(leaderName) \(onLeader)"
        )
        #expect(onRejoined.count == 2 && onRejoined[1] >= 1, "\(onRejoined)")
        #expect(onLeader.count == 2 && onLeader[1] == 0, "\(onLeader)")
    }

    /// `/readyz` of `daemon` every 200 ms until cancelled: when, and with what status (0: no answer).
    static func watchReadiness(_ daemon: DaemonProcess) -> Task<[(at: ContinuousClock.Instant, status: Int)], Never> {
        Task {
            var answers: [(at: ContinuousClock.Instant, status: Int)] = []
            while !Task.isCancelled {
                let status = (try? await daemon.request("/readyz").status.code) ?? 0
                answers.append((ContinuousClock.now, status))
                try? await Task.sleep(for: .milliseconds(200))
            }
            return answers
        }
    }

    /// `HOST:PORT` of a one-host libpq URL.
    static func address(_ url: String) -> String? {
        guard let at = url.firstIndex(of: "@") else { return nil }
        let rest = url[url.index(after: at)...]
        return rest.split(separator: "/", maxSplits: 1).first.map(String.init)
    }
}

extension Array {
    fileprivate func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var values: [T] = []
        for element in self { values.append(try await transform(element)) }
        return values
    }
}

/// Latest reads, 4 at a time, until stopped: how many were answered 200, how many not, and the seconds between
/// the first and the last that were not.
final class ReadLoad: Sendable {
    struct Outcome: CustomStringConvertible, Sendable {
        var ok = 0
        var failed = 0
        var first: ContinuousClock.Instant?
        var last: ContinuousClock.Instant?
        var failureWindow: Double { self.first.flatMap { first in self.last.map { ($0 - first).faultSeconds } } ?? 0 }
        var description: String {
            "reads \(self.ok) × 200, \(self.failed) failed within \(String(format: "%.1f", self.failureWindow)) s"
        }
    }

    private final class Flag: Sendable {
        let raised = Atomic<Bool>(false)
    }

    private let stopping = Flag()
    private let task: Task<Outcome, Never>

    init(daemons: [DaemonProcess], users: [Int64]) {
        let stopping = self.stopping
        self.task = Task {
            await withTaskGroup(of: Outcome.self) { group in
                for worker in 0..<4 {
                    group.addTask { await Self.read(worker: worker, daemons: daemons, users: users, until: stopping) }
                }
                var outcome = Outcome()
                for await part in group {
                    outcome.ok += part.ok
                    outcome.failed += part.failed
                    if let start = part.first { outcome.first = min(outcome.first ?? start, start) }
                    if let end = part.last { outcome.last = max(outcome.last ?? end, end) }
                }
                return outcome
            }
        }
    }

    private static func read(worker: Int, daemons: [DaemonProcess], users: [Int64], until stopping: Flag) async
        -> Outcome
    {
        var outcome = Outcome()
        var index = worker
        while !stopping.raised.load(ordering: .relaxed) {
            let id = users[index % users.count]
            let response = try? await daemons[index % daemons.count].request(
                "/v1/profile/metrics/today", headers: TestTokens.bearer(TestTokens.user(id)))
            if response?.status == .ok {
                outcome.ok += 1
            } else {
                outcome.failed += 1
                outcome.first = outcome.first ?? .now
                outcome.last = .now
            }
            index += 4
        }
        return outcome
    }

    func stop() async -> Outcome {
        self.stopping.raised.store(true, ordering: .relaxed)
        return await self.task.value
    }
}
