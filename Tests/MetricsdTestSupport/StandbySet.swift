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
    private let script: String

    private init(primary: ThrowawayCluster, standbys: [ThrowawayCluster], script: String) {
        self.primary = primary
        self.standbys = standbys
        self.script = script
    }

    /// Creates and starts the primary (with `pg_stat_statements` in its database `postgres`) and `count` standbys.
    package static func create(_ label: String, standbys count: Int) async throws -> StandbySet {
        let script = try #require(
            ProcessInfo.processInfo.environment["METRICSD_PG_CLUSTER"].flatMap { $0.isEmpty ? nil : $0 },
            "METRICSD_PG_CLUSTER is not set: run the tests with the README's test command (scripts/test)")
        let primary = try await ThrowawayCluster.create("\(label)-p")
        let base = URL(fileURLWithPath: primary.directory).deletingLastPathComponent()
        let standbys = (1...count).map { index in
            ThrowawayCluster(
                directory: base.appendingPathComponent("\(label)-s\(index)-" + UUID().uuidString.prefix(8).lowercased()).path,
                port: DaemonProcess.freePort(), script: script)
        }
        let set = StandbySet(primary: primary, standbys: standbys, script: script)
        do {
            try await primary.start()
            _ = try await set.value(on: primary, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            try await primary.stop()
            try await primary.start()
            _ = try await set.value(on: primary, "CREATE EXTENSION pg_stat_statements")
            for standby in standbys {
                try await set.run("standby", standby.directory, String(standby.port), primary.directory, "async")
            }
        } catch {
            await set.destroy()
            throw error
        }
        return set
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

    /// One value from `sql` run with psql on `member` (database `postgres`).
    package func value(on member: ThrowawayCluster, _ sql: String) async throws -> String {
        let (status, stdout, stderr) = try await Subprocess.capture(
            self.script, ["psql", member.directory, "postgres", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        try #require(status == 0, "psql on \(member.directory) failed (\(status)): \(stderr)")
        return stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Stops replaying WAL on a standby (it keeps receiving it and answering queries).
    package func pauseReplay(_ standby: ThrowawayCluster) async throws {
        _ = try await self.value(on: standby, "SELECT pg_wal_replay_pause()")
    }

    package func resumeReplay(_ standby: ThrowawayCluster) async throws {
        _ = try await self.value(on: standby, "SELECT pg_wal_replay_resume()")
    }

    /// Stops and deletes every server; never throws.
    package func destroy() async {
        for standby in self.standbys { await standby.destroy() }
        await self.primary.destroy()
    }

    private func run(_ arguments: String...) async throws {
        let (status, output) = try await Subprocess.run(self.script, arguments)
        try #require(status == 0, "pg-cluster \(arguments.joined(separator: " ")) failed (\(status)):\n\(output)")
    }
}

/// Runs `body` with a fresh primary and `standbys` standbys, destroyed afterwards whatever happens.
package func withStandbySet<T>(_ label: String, standbys: Int, _ body: (StandbySet) async throws -> T) async throws -> T {
    let set = try await StandbySet.create(label, standbys: standbys)
    do {
        let value = try await body(set)
        await set.destroy()
        return value
    } catch {
        await set.destroy()
        throw error
    }
}
