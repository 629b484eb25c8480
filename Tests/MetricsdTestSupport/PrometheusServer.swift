import Foundation
import Glibc
import HTTPTypes
import HummingbirdTesting
import Testing

/// Debian's Prometheus (`/usr/bin/prometheus`, package `prometheus`) started by a test: its own configuration, TSDB
/// and log in a unique directory under `METRICSD_TEST_TMP`, on a free loopback port; never the system service. Use
/// it through ``withPrometheus(_:configuration:_:)``, which always stops it and deletes its directory.
///
/// The configuration is written as JSON (slashes unescaped: YAML has no `\/`), which Prometheus reads as YAML.
package final class PrometheusServer: @unchecked Sendable {  // `process` is only signalled and read after start
    package static let binary = "/usr/bin/prometheus"
    package let port: Int
    package let directory: String
    private let process: Process

    private init(port: Int, directory: String, process: Process) {
        self.port = port
        self.directory = directory
        self.process = process
    }

    /// Writes `configuration` (prometheus.yml as a JSON object) and starts Prometheus on it; returns once it is ready.
    package static func start(_ label: String, configuration: [String: Any]) async throws -> PrometheusServer {
        let directory = try LoopbackService.makeDirectory(label)
        let port = DaemonProcess.freePort()
        let configPath = directory + "/prometheus.json"
        try JSONSerialization.data(
            withJSONObject: configuration, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        )
        .write(to: URL(fileURLWithPath: configPath))
        let process = try LoopbackService.launch(
            Self.binary, package: "prometheus",
            [
                "--config.file=\(configPath)", "--storage.tsdb.path=\(directory)/data",
                "--web.listen-address=127.0.0.1:\(port)", "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ], log: directory + "/prometheus.log")
        let server = PrometheusServer(port: port, directory: directory, process: process)
        do {
            try await LoopbackService.waitUntilReady(
                process, port: port, path: "/-/ready", log: server.log, name: "prometheus")
        } catch {
            await server.stop()
            throw error
        }
        return server
    }

    /// Waits until Prometheus scrapes every one of `jobs` (an `up` series for each, up or not): it takes up a new
    /// configuration's targets only after its discovery's first update, some seconds after start.
    package func waitUntilScraping(_ jobs: [String], timeout: Duration = .seconds(30)) async throws {
        var missing = jobs
        let scraping = await DaemonProcess.eventually(timeout: timeout) {
            let scraped = Set(((try? await self.query("up")) ?? []).compactMap { $0.labels["job"] })
            missing = jobs.filter { !scraped.contains($0) }
            return missing.isEmpty
        }
        try #require(
            scraping, "prometheus does not scrape \(missing) after \(timeout); its log:\n\(self.log.suffix(3000))")
    }

    /// What Prometheus logged (warnings and errors).
    package var log: String { (try? String(contentsOfFile: self.directory + "/prometheus.log", encoding: .utf8)) ?? "" }

    /// One sample of an instant query's vector (or scalar) result.
    package struct Sample: Sendable, CustomStringConvertible {
        package let labels: [String: String]
        package let value: Double
        package var description: String {
            "\(self.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }) \(self.value)"
        }
    }

    /// `GET /api/v1/query`: the samples of `expression` now. Throws when Prometheus refuses the expression.
    package func query(_ expression: String) async throws -> [Sample] {
        let data = try await self.api("/api/v1/query?query=" + Self.encoded(expression))
        let result = try #require(data["result"], "no result for \(expression): \(data)")
        switch data["resultType"] as? String {
        case "vector":
            return try #require(result as? [[String: Any]]).map { item in
                let pair = item["value"] as? [Any] ?? []
                return Sample(
                    labels: item["metric"] as? [String: String] ?? [:],
                    value: Double(pair.last as? String ?? "") ?? .nan)
            }
        case "scalar":
            let pair = result as? [Any] ?? []
            return [Sample(labels: [:], value: Double(pair.last as? String ?? "") ?? .nan)]
        default:
            Issue.record("unexpected result type for \(expression): \(data)")
            return []
        }
    }

    /// One pending or firing alert (`GET /api/v1/alerts`; resolved alerts are not listed).
    package struct Alert: Sendable, CustomStringConvertible {
        package let name: String
        package let state: String
        package let labels: [String: String]
        package let annotations: [String: String]
        package var description: String { "\(self.name) \(self.state) \(self.labels.filter { $0.key != "alertname" })" }
    }

    package func alerts() async throws -> [Alert] {
        let data = try await self.api("/api/v1/alerts")
        return (data["alerts"] as? [[String: Any]] ?? []).map { item in
            let labels = item["labels"] as? [String: String] ?? [:]
            return Alert(
                name: labels["alertname"] ?? "", state: item["state"] as? String ?? "", labels: labels,
                annotations: item["annotations"] as? [String: String] ?? [:])
        }
    }

    /// The `data` object of an API answer; throws with Prometheus's error when it is not a success.
    private func api(_ path: String) async throws -> [String: Any] {
        let response = try await LoopbackService.get(port: self.port, path)
        let object = try JSONSerialization.jsonObject(with: Data(response.text.utf8)) as? [String: Any]
        try #require(
            object?["status"] as? String == "success",
            "prometheus \(path): \(response.status) \(response.text.prefix(500))")
        return try #require(
            object?["data"] as? [String: Any], "prometheus \(path): no data: \(response.text.prefix(500))")
    }

    /// Percent-encoding for a query parameter: everything but RFC 3986's unreserved characters.
    static func encoded(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }

    /// Stops it (SIGTERM, then SIGKILL after 10 s) and deletes its directory; never throws.
    package func stop() async {
        await LoopbackService.stop(self.process)
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    /// A scrape job of `prometheus.yml`: `target` (host:port) scraped at `path`, over HTTPS trusting `caFile` when
    /// given.
    package static func scrapeJob(_ name: String, target: String, path: String = "/metrics", caFile: String? = nil)
        -> [String: Any]
    {
        var job: [String: Any] = ["job_name": name, "metrics_path": path, "static_configs": [["targets": [target]]]]
        if let caFile {
            job["scheme"] = "https"
            job["tls_config"] = ["ca_file": caFile]
        }
        return job
    }

    /// A blackbox-exporter job: `url` probed by the exporter at `exporter` (host:port) with `module`; the series are
    /// labelled instance=`url`, as the exporter's documentation sets it up.
    package static func probeJob(_ name: String, url: String, exporter: String, module: String = "http_2xx") -> [String:
        Any]
    {
        [
            "job_name": name, "metrics_path": "/probe", "params": ["module": [module]],
            "static_configs": [["targets": [url]]],
            "relabel_configs": [
                ["source_labels": ["__address__"], "target_label": "__param_target"],
                ["source_labels": ["__param_target"], "target_label": "instance"],
                ["target_label": "__address__", "replacement": exporter],
            ],
        ]
    }
}

/// Debian's blackbox exporter (`/usr/bin/prometheus-blackbox-exporter`, package `prometheus-blackbox-exporter`), as
/// the alert rules expect in front of `/readyz`: started by a test on a free loopback port with its own module
/// file. Use it through ``withBlackboxExporter(_:modules:_:)``.
package final class BlackboxExporter: @unchecked Sendable {
    package static let binary = "/usr/bin/prometheus-blackbox-exporter"
    package let port: Int
    package let directory: String
    private let process: Process

    private init(port: Int, directory: String, process: Process) {
        self.port = port
        self.directory = directory
        self.process = process
    }

    /// `host:port`, for ``PrometheusServer/probeJob(_:url:exporter:module:)``.
    package var address: String { "127.0.0.1:\(self.port)" }

    /// Starts it with `modules` (blackbox.yml's `modules` as a JSON object); returns once it answers.
    package static func start(_ label: String, modules: [String: Any]) async throws -> BlackboxExporter {
        let directory = try LoopbackService.makeDirectory(label)
        let port = DaemonProcess.freePort()
        let configPath = directory + "/blackbox.json"
        try JSONSerialization.data(
            withJSONObject: ["modules": modules], options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        )
        .write(to: URL(fileURLWithPath: configPath))
        // The probe may use the scrape's whole timeout but 100 ms (the default keeps 500 ms back).
        let process = try LoopbackService.launch(
            Self.binary, package: "prometheus-blackbox-exporter",
            [
                "--config.file=\(configPath)", "--web.listen-address=127.0.0.1:\(port)", "--timeout-offset=0.1",
                "--log.level=warn",
            ],
            log: directory + "/blackbox.log")
        let exporter = BlackboxExporter(port: port, directory: directory, process: process)
        do {
            try await LoopbackService.waitUntilReady(
                process, port: port, path: "/-/healthy",
                log: (try? String(contentsOfFile: directory + "/blackbox.log", encoding: .utf8)) ?? "",
                name: "blackbox exporter")
        } catch {
            await exporter.stop()
            throw error
        }
        return exporter
    }

    package func stop() async {
        await LoopbackService.stop(self.process)
        try? FileManager.default.removeItem(atPath: self.directory)
    }
}

/// Starting, waiting for and stopping the monitoring programs the tests run on loopback.
enum LoopbackService {
    /// A new directory `label-XXXXXXXX` under `METRICSD_TEST_TMP` (else the system's temporary directory).
    static func makeDirectory(_ label: String) throws -> String {
        let base =
            ProcessInfo.processInfo.environment["METRICSD_TEST_TMP"].flatMap { $0.isEmpty ? nil : $0 }
            ?? NSTemporaryDirectory()
        let directory = URL(fileURLWithPath: base).appendingPathComponent(
            "\(label)-" + UUID().uuidString.prefix(8).lowercased()
        ).path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return directory
    }

    /// Starts `binary arguments` with stdout and stderr in `log`; a missing binary fails the test, naming its package.
    static func launch(_ binary: String, package: String, _ arguments: [String], log: String) throws -> Process {
        try #require(
            FileManager.default.isExecutableFile(atPath: binary),
            "\(binary) is missing: apt-get install \(package) (scripts/test installs it)")
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let output = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = output
        process.standardError = output
        try process.run()
        try? output.close()
        return process
    }

    /// Polls `GET path` until it answers 200 (30 s at most); fails with the program's log when it exits or never does.
    static func waitUntilReady(
        _ process: Process, port: Int, path: String, log: @autoclosure () -> String, name: String
    ) async throws {
        let ready = await DaemonProcess.eventually(timeout: .seconds(30)) {
            guard process.isRunning else { return false }
            return (try? await Self.get(port: port, path).status.code) == 200
        }
        try #require(
            ready,
            "\(name) did not become ready on 127.0.0.1:\(port) (running: \(process.isRunning)); its log:\n\(log().suffix(3000))"
        )
    }

    /// `GET path` with a Host header (Go's HTTP server refuses an HTTP/1.1 request without one).
    static func get(port: Int, _ path: String) async throws -> TestClient.Response {
        try await TestClient.withClient(host: "127.0.0.1", port: port, configuration: .init(timeout: .seconds(20))) {
            client in
            try await client.execute(.init(path, method: .get, authority: "127.0.0.1:\(port)"))
        }
    }

    static func stop(_ process: Process) async {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        let deadline = ContinuousClock.now + .seconds(10)
        while process.isRunning && ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(50))
        }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

/// Runs `body` with a Prometheus started on `configuration`, stopped and deleted afterwards whatever happens.
package func withPrometheus<T>(
    _ label: String, configuration: [String: Any], _ body: (PrometheusServer) async throws -> T
) async throws -> T {
    try await withCleanup(
        try await PrometheusServer.start(label, configuration: configuration), cleanup: { await $0.stop() }, body)
}

/// Runs `body` with a blackbox exporter started with `modules`, stopped and deleted afterwards whatever happens.
package func withBlackboxExporter<T>(
    _ label: String, modules: [String: Any], _ body: (BlackboxExporter) async throws -> T
) async throws -> T {
    try await withCleanup(
        try await BlackboxExporter.start(label, modules: modules), cleanup: { await $0.stop() }, body)
}
