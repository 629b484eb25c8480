import Foundation
import Glibc
import Testing

/// Debian's PgBouncer in front of a PostgreSQL server, for one test: started with `scripts/pg-cluster pgbouncer`
/// (`METRICSD_PG_CLUSTER`) in a unique directory under `METRICSD_TEST_TMP`, stock but for the listen port,
/// trust authentication, the pool mode and the `lines` given. A missing pgbouncer fails the test. Always
/// ``destroy()`` it (also on failure).
package struct PgBouncer: Sendable {
    package enum Mode: String, Sendable { case transaction, session }

    package let directory: String
    package let port: Int
    package let script: String

    /// Starts one on a free port in front of the server at 127.0.0.1:`upstreamPort`, every database.
    package static func start(
        _ label: String, upstreamPort: Int, mode: Mode, lines: [String] = []
    ) async throws -> PgBouncer {
        let environment = ProcessInfo.processInfo.environment
        let script = try #require(
            environment["METRICSD_PG_CLUSTER"].flatMap { $0.isEmpty ? nil : $0 },
            "METRICSD_PG_CLUSTER is not set: run the tests with the README's test command (scripts/test)")
        let base = environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 } ?? NSTemporaryDirectory()
        let directory = URL(fileURLWithPath: base)
            .appendingPathComponent("pgb-\(label)-" + UUID().uuidString.prefix(8).lowercased()).path
        let bouncer = PgBouncer(directory: directory, port: DaemonProcess.freePort(), script: script)
        let arguments =
            ["pgbouncer", "start", directory, String(bouncer.port), String(upstreamPort), mode.rawValue] + lines
        let (status, output) = try await Subprocess.run(script, arguments)
        guard status == 0 else {
            await bouncer.destroy()
            try #require(status == 0, "pg-cluster \(arguments.joined(separator: " ")) failed (\(status)):\n\(output)")
            throw CancellationError()
        }
        return bouncer
    }

    private init(directory: String, port: Int, script: String) {
        self.directory = directory
        self.port = port
        self.script = script
    }

    /// `postgresql://postgres@127.0.0.1:PORT/DATABASE?sslmode=disable`, through this PgBouncer.
    package func url(database: String) -> String {
        "postgresql://postgres@127.0.0.1:\(self.port)/\(database)?sslmode=disable"
    }

    /// PgBouncer's own log.
    package var log: String { (try? String(contentsOfFile: self.directory + "/pgbouncer.log", encoding: .utf8)) ?? "" }

    /// Stops it and deletes its directory; never throws.
    package func destroy() async {
        _ = try? await Subprocess.run(self.script, ["pgbouncer", "destroy", self.directory])
    }
}

extension TestDatabase {
    /// The port of the test server (`METRICSD_TEST_DATABASE_URL`), for a PgBouncer in front of it.
    package static func serverPort() throws -> Int {
        let url = try Self.serverURL()
        let port = url.split(separator: ":").last.map { $0.prefix { $0.isNumber } }.flatMap { Int($0) }
        return try #require(port, "no port in METRICSD_TEST_DATABASE_URL \(url)")
    }
}
