import Foundation
import Testing

/// A private Patroni cluster (etcd, two PostgreSQL members, HAProxy) for one test, made with `scripts/ha-cluster`
/// (beside `METRICSD_PG_CLUSTER`) in a unique directory under `METRICSD_TEST_TMP`, on 11 ports from a base below the
/// ephemeral range. A missing etcd, Patroni or HAProxy fails the test. Always ``destroy()`` it.
package struct PatroniCluster: Sendable {
    package let directory: String
    private let script: String

    /// Creates and starts it (a minute or so); tries another base port when one of its ports is taken.
    package static func create(_ label: String) async throws -> PatroniCluster {
        let environment = ProcessInfo.processInfo.environment
        let pgCluster = try #require(
            environment["METRICSD_PG_CLUSTER"].flatMap { $0.isEmpty ? nil : $0 },
            "METRICSD_PG_CLUSTER is not set: run the tests with the README's test command (scripts/test)")
        let script = URL(fileURLWithPath: pgCluster).deletingLastPathComponent().appendingPathComponent("ha-cluster")
            .path
        let base = environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 } ?? NSTemporaryDirectory()
        var output = ""
        for _ in 0..<3 {
            let directory = URL(fileURLWithPath: base)
                .appendingPathComponent("\(label)-" + UUID().uuidString.prefix(8).lowercased()).path
            let cluster = PatroniCluster(directory: directory, script: script)
            let port = Int.random(in: 20_000..<31_000)
            let result = try await Subprocess.run(script, ["create", directory, String(port)])
            if result.status == 0 { return cluster }
            output = result.output
            await cluster.destroy()
        }
        try #require(Bool(false), "ha-cluster create failed:\n\(output)")
        throw CancellationError()
    }

    /// `scripts/ha-cluster url DIR WHICH DATABASE`.
    package func url(_ which: String, database: String) async throws -> String {
        try await self.run("url", which, database).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Runs `scripts/ha-cluster COMMAND DIR ARGUMENTS…`; its output, or a failed test when it fails.
    @discardableResult
    package func run(_ command: String, _ arguments: String...) async throws -> String {
        let (status, output) = try await Subprocess.run(self.script, [command, self.directory] + arguments)
        try #require(
            status == 0, "ha-cluster \(command) \(arguments.joined(separator: " ")) failed (\(status)):\n\(output)")
        return output
    }

    /// Kills every process of the cluster and deletes it; never throws.
    package func destroy() async {
        _ = try? await Subprocess.run(self.script, ["destroy", self.directory])
    }
}
