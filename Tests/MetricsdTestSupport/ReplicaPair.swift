import Foundation
import Testing

/// A PostgreSQL primary and a streaming standby (`pg_basebackup -R`) on free ports, for failover tests. Made with
/// `scripts/pg-cluster` (`METRICSD_PG_CLUSTER`) in unique directories under `METRICSD_TEST_TMP`; the shared test
/// server is never touched. Use it through ``withReplicaPair(_:synchronous:_:)``, which always destroys both.
///
/// The roles move: after ``failOver()`` the standby is the primary; ``rejoinOldPrimary()`` makes the old primary a
/// standby of the new one (a fresh copy, as after `pg_rewind`) on its old port.
package final class ReplicaPair: Sendable {
    package let first: ThrowawayCluster
    package let second: ThrowawayCluster
    package let synchronous: Bool
    private let script: String

    private init(first: ThrowawayCluster, second: ThrowawayCluster, synchronous: Bool, script: String) {
        self.first = first
        self.second = second
        self.synchronous = synchronous
        self.script = script
    }

    /// Creates and starts the primary (`first`) and a standby of it (`second`), synchronous or not.
    package static func create(_ label: String, synchronous: Bool) async throws -> ReplicaPair {
        let script = try #require(
            ProcessInfo.processInfo.environment["METRICSD_PG_CLUSTER"].flatMap { $0.isEmpty ? nil : $0 },
            "METRICSD_PG_CLUSTER is not set: run the tests with the README's test command (scripts/test)")
        let first = try await ThrowawayCluster.create("\(label)-a")
        let base = URL(fileURLWithPath: first.directory).deletingLastPathComponent()
        let second = ThrowawayCluster(
            directory: base.appendingPathComponent("\(label)-b-" + UUID().uuidString.prefix(8).lowercased()).path,
            port: DaemonProcess.freePort(), script: script)
        let pair = ReplicaPair(first: first, second: second, synchronous: synchronous, script: script)
        do {
            try await first.start()
            try await pair.run("standby", second.directory, String(second.port), first.directory, synchronous ? "sync" : "async")
        } catch {
            await pair.destroy()
            throw error
        }
        return pair
    }

    /// The multi-host URL a daemon uses: `postgresql://postgres@127.0.0.1:A,127.0.0.1:B/DB?target_session_attrs=read-write`,
    /// hosts in the given order (default: primary first).
    package func url(database: String = "postgres", order: [ThrowawayCluster]? = nil) -> String {
        let hosts = (order ?? [self.first, self.second]).map { "127.0.0.1:\($0.port)" }.joined(separator: ",")
        return "postgresql://postgres@\(hosts)/\(database)?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
    }

    /// The one-host URL of a member.
    package func url(of member: ThrowawayCluster, database: String = "postgres") -> String {
        "postgresql://postgres@127.0.0.1:\(member.port)/\(database)?sslmode=disable"
    }

    /// Stops the primary (`first`) the hard way (`-m immediate`, as a crash) and promotes the standby, clearing its
    /// inherited `synchronous_standby_names` as failover managers do. Returns the instant the promotion completed.
    @discardableResult
    package func failOver() async throws -> ContinuousClock.Instant {
        try await self.crashPrimary()
        return try await self.promoteStandby()
    }

    /// The first half of ``failOver()``: the primary stops `-m immediate`; no read-write server is left.
    package func crashPrimary() async throws {
        try await self.run("stop", self.first.directory, "immediate")
    }

    /// The second half: `second` is promoted (its inherited `synchronous_standby_names` cleared, unless
    /// `keepSync`: then every COMMIT on it waits for a standby that does not exist). The instant it was.
    package func promoteStandby(keepSync: Bool = false) async throws -> ContinuousClock.Instant {
        if keepSync {
            try await self.run("promote", self.second.directory, "keep-sync")
        } else {
            try await self.run("promote", self.second.directory)
        }
        return ContinuousClock.now
    }

    /// After ``failOver()``: the old primary comes back as a (synchronous or not) standby of the new one, on its
    /// old port.
    package func rejoinOldPrimary() async throws {
        try await self.run(
            "standby", self.first.directory, String(self.first.port), self.second.directory,
            self.synchronous ? "sync" : "async")
    }

    /// After ``crashPrimary()``, with no daemon left: starts the old primary on its own (crash recovery, still a
    /// primary) to read what it had committed; for measuring what an asynchronous failover lost.
    package func startOldPrimaryAlone() async throws {
        try await self.run("start", self.first.directory)
    }

    /// One value from `sql` run with psql on `member` (which may be a standby: metricsd's own connections refuse
    /// read-only servers).
    package func value(on member: ThrowawayCluster, _ sql: String) async throws -> String {
        let (status, stdout, stderr) = try await Subprocess.capture(
            self.script, ["psql", member.directory, "postgres", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        try #require(status == 0, "psql on \(member.directory) failed (\(status)): \(stderr)")
        return stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Stops (immediately) and deletes both clusters; never throws.
    package func destroy() async {
        await self.first.destroy()
        await self.second.destroy()
    }

    private func run(_ arguments: String...) async throws {
        let (status, output) = try await Subprocess.run(self.script, arguments)
        try #require(status == 0, "pg-cluster \(arguments.joined(separator: " ")) failed (\(status)):\n\(output)")
    }
}

/// Runs `body` with a fresh primary/standby pair, destroyed afterwards whatever happens.
package func withReplicaPair<T>(
    _ label: String, synchronous: Bool = true, _ body: (ReplicaPair) async throws -> T
) async throws -> T {
    let pair = try await ReplicaPair.create(label, synchronous: synchronous)
    do {
        let value = try await body(pair)
        await pair.destroy()
        return value
    } catch {
        await pair.destroy()
        throw error
    }
}
