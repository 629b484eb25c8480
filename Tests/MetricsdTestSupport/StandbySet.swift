import Foundation
import Testing

/// A PostgreSQL primary and asynchronous streaming standbys of it (`pg_basebackup -R`), each on a free port, for the
/// read-server tests: `scripts/pg-cluster` (`METRICSD_PG_CLUSTER`) in unique directories under `METRICSD_TEST_TMP`.
/// Every server loads `pg_stat_statements` (set on the primary before the standbys are copied from it), so a test
/// can tell from each server's own statistics which statements ran there. Use it through
/// ``withStandbySet(_:standbys:_:)``, which always destroys every server.
package final class StandbySet: Sendable {
    package let primary: ThrowawayCluster
    package let standbys: [ThrowawayCluster]

    private init(primary: ThrowawayCluster, standbys: [ThrowawayCluster]) {
        self.primary = primary
        self.standbys = standbys
    }

    /// Creates and starts the primary (with `pg_stat_statements` in its database `postgres`) and `count` standbys.
    package static func create(_ label: String, standbys count: Int) async throws -> StandbySet {
        let primary = try await ThrowawayCluster.create("\(label)-p")
        var standbys: [ThrowawayCluster] = []
        do {
            try await primary.start()
            _ = try await primary.value("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            try await primary.stop()
            try await primary.start()
            _ = try await primary.value("CREATE EXTENSION pg_stat_statements")
            for index in 1...count {
                standbys.append(try await primary.standby("\(label)-s\(index)", synchronous: false))
            }
        } catch {
            await StandbySet(primary: primary, standbys: standbys).destroy()
            throw error
        }
        return StandbySet(primary: primary, standbys: standbys)
    }

    /// The primary's URL (database `postgres`).
    package var primaryURL: String { self.primary.url }

    /// One multi-host URL naming every standby, in order: `postgresql://postgres@127.0.0.1:A,127.0.0.1:B/postgres?…`.
    package var readURL: String {
        let hosts = self.standbys.map { "127.0.0.1:\($0.port)" }.joined(separator: ",")
        return "postgresql://postgres@\(hosts)/postgres?sslmode=disable&connect_timeout=2"
    }

    /// `host:port` as the daemon labels a server.
    package func label(_ member: ThrowawayCluster) -> String { "127.0.0.1:\(member.port)" }

    /// Stops replaying WAL on a standby (it keeps receiving it and answering queries).
    package func pauseReplay(_ standby: ThrowawayCluster) async throws {
        _ = try await standby.value("SELECT pg_wal_replay_pause()")
    }

    package func resumeReplay(_ standby: ThrowawayCluster) async throws {
        _ = try await standby.value("SELECT pg_wal_replay_resume()")
    }

    /// Stops and deletes every server; never throws.
    package func destroy() async {
        for standby in self.standbys { await standby.destroy() }
        await self.primary.destroy()
    }
}

/// Runs `body` with a fresh primary and `standbys` standbys, destroyed afterwards whatever happens.
package func withStandbySet<T>(_ label: String, standbys: Int, _ body: (StandbySet) async throws -> T) async throws -> T
{
    try await withCleanup(
        try await StandbySet.create(label, standbys: standbys), cleanup: { await $0.destroy() }, body)
}
