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

    private init(first: ThrowawayCluster, second: ThrowawayCluster, synchronous: Bool) {
        self.first = first
        self.second = second
        self.synchronous = synchronous
    }

    /// Creates and starts the primary (`first`) and a standby of it (`second`), synchronous or not.
    package static func create(_ label: String, synchronous: Bool) async throws -> ReplicaPair {
        let first = try await ThrowawayCluster.create("\(label)-a")
        do {
            try await first.start()
            let second = try await first.standby("\(label)-b", synchronous: synchronous)
            return ReplicaPair(first: first, second: second, synchronous: synchronous)
        } catch {
            await first.destroy()
            throw error
        }
    }

    /// The multi-host URL a daemon uses: `postgresql://postgres@127.0.0.1:A,127.0.0.1:B/DB?target_session_attrs=read-write`,
    /// hosts in the given order (default: primary first).
    package func url(database: String = "postgres", order: [ThrowawayCluster]? = nil) -> String {
        let hosts = (order ?? [self.first, self.second]).map { "127.0.0.1:\($0.port)" }.joined(separator: ",")
        return
            "postgresql://postgres@\(hosts)/\(database)?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
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
        try await self.first.run("stop", self.first.directory, "immediate")
    }

    /// The second half: `second` is promoted (its inherited `synchronous_standby_names` cleared, unless
    /// `keepSync`: then every COMMIT on it waits for a standby that does not exist). The instant it was.
    package func promoteStandby(keepSync: Bool = false) async throws -> ContinuousClock.Instant {
        if keepSync {
            try await self.second.run("promote", self.second.directory, "keep-sync")
        } else {
            try await self.second.run("promote", self.second.directory)
        }
        return ContinuousClock.now
    }

    /// After ``failOver()``: the old primary comes back as a (synchronous or not) standby of the new one, on its
    /// old port.
    package func rejoinOldPrimary() async throws {
        try await self.first.run(
            "standby", self.first.directory, String(self.first.port), self.second.directory,
            self.synchronous ? "sync" : "async")
    }

    /// After ``crashPrimary()``, with no daemon left: starts the old primary on its own (crash recovery, still a
    /// primary) to read what it had committed; for measuring what an asynchronous failover lost.
    package func startOldPrimaryAlone() async throws {
        try await self.first.start()
    }

    /// Stops (immediately) and deletes both clusters; never throws.
    package func destroy() async {
        await self.first.destroy()
        await self.second.destroy()
    }
}

/// Runs `body` with a fresh primary/standby pair, destroyed afterwards whatever happens.
package func withReplicaPair<T>(
    _ label: String, synchronous: Bool = true, _ body: (ReplicaPair) async throws -> T
) async throws -> T {
    try await withCleanup(
        try await ReplicaPair.create(label, synchronous: synchronous), cleanup: { await $0.destroy() }, body)
}
