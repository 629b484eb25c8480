import Foundation
import MetricsdTestSupport
import Testing

/// Work queued while no session listens for its notification (the daemon just started, or its listening session is
/// being made again) is started as soon as one listens, not at the workers' idle poll.
@Suite struct WorkWakeUpTests {
    /// The listening session names a role that does not exist yet (`METRICSD_NOTIFY_DATABASE_URL`), so it fails and
    /// retries while a recompute job is queued: the job's NOTIFY reaches nobody. Once the role exists, the session
    /// listens and the workers look at once: the job is done long before their idle poll (120 s) would have found
    /// it. Before, it waited for that poll: a daemon that had just become ready when recompute-all was run started
    /// the job up to `METRICSD_IDLE_POLL_SECONDS` late.
    @Test(.timeLimit(.minutes(3))) func workQueuedBeforeTheListenerListensStartsWhenItDoes() async throws {
        try await withTestDatabase { database in
            try await database.seed((1...40).map { SeedUser.valid(Int64($0)) })
            let role = "metricsd_late_listener_\(UInt32.random(in: 0...UInt32.max))"
            let notifyURL = database.url.replacingOccurrences(of: "//postgres@", with: "//\(role)@")
            try #require(notifyURL != database.url, "\(database.url)")
            let daemon = try await DaemonProcess.start(
                database: database,
                extra: [
                    "METRICSD_NOTIFY_DATABASE_URL": notifyURL, "METRICSD_IDLE_POLL_SECONDS": "120",
                    "METRICSD_TEST_FORMULA_VERSION": "2",
                ])
            defer { daemon.signal(SIGKILL) }
            do {
                try await Self.queueWhileNobodyListens(database, daemon: daemon, role: role)
            } catch {
                try? await database.execute("DROP ROLE IF EXISTS \(role)")
                throw error
            }
            await daemon.stop()
            // A role belongs to the cluster, not to the test's database.
            try await database.execute("DROP ROLE \(role)")
        }
    }

    static func queueWhileNobodyListens(_ database: TestDatabase, daemon: DaemonProcess, role: String) async throws {
        // The day's units of version 2 that fell due at start (whenever the day's 00:05 has passed) are done before
        // the job is queued, and their rows taken away again: the job has every row to write.
        try await Task.sleep(for: .seconds(1))
        let settled = try await DaemonProcess.eventually(timeout: .seconds(60)) {
            try await database.value("SELECT count(*) FROM work_chunks WHERE state IN ('pending', 'running')") == "0"
        }
        try #require(settled, "\(daemon.log.suffix(2000))")
        try await database.execute("DELETE FROM profile_metrics WHERE version = 2")
        let trigger = try await Subprocess.run(
            try DaemonProcess.binary(), ["recompute-all"],
            environment: ["DATABASE_URL": database.url, "METRICSD_TEST_FORMULA_VERSION": "2"])
        try #require(trigger.status == 0, "\(trigger.output)")
        // Nobody listens yet: the job stays queued.
        try await Task.sleep(for: .seconds(2))
        #expect(
            try await database.value("SELECT state FROM recompute_jobs ORDER BY id DESC LIMIT 1") == "pending",
            "\(daemon.log.suffix(2000))")
        try await database.execute("CREATE ROLE \(role) LOGIN")
        let created = ContinuousClock.now
        let done = try await DaemonProcess.eventually(timeout: .seconds(60)) {
            try await database.value("SELECT state FROM recompute_jobs ORDER BY id DESC LIMIT 1") == "done"
        }
        let waited = ContinuousClock.now - created
        #expect(done, "the job was not done 60 s after a session could listen:\n\(daemon.log.suffix(3000))")
        // The listener retries with a growing backoff (at most 8 s this early), then listens.
        #expect(waited < .seconds(30), "done \(waited) after the session could listen")
        #expect(try await database.value("SELECT count(*) FROM profile_metrics WHERE version = 2") == "40")
    }
}
