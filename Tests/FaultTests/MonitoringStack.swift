import Foundation
import HTTPTypes
import HummingbirdTesting
import MetricsdTestSupport
import Testing

/// The live set-up of ``MonitoringTests``' healthy runs, as an operator would run it: a primary and an asynchronous
/// standby (``StandbySet``); the real daemon on the primary, reading the latest metrics from the standby (bound
/// 1 s), with TLS on its internal listener (`/metrics`, `/readyz`) and retention on; the blackbox exporter probing
/// that `/readyz` as job `metricsd-readyz`; Prometheus scraping `/metrics` over TLS as job `metricsd`, every second,
/// with `rules`. Users' latest reads run in the background all along (one every 200 ms).
struct MonitoringStack {
    let set: StandbySet
    let primary: FaultDatabase
    let daemon: DaemonProcess
    let environment: [String: String]
    let internalPort: Int
    let certificate: TestCertificate
    let prometheus: PrometheusServer
    let users: [Int64]
    /// When Prometheus started: the range a dashboard looking at this run shows.
    let started: ContinuousClock.Instant

    var standby: ThrowawayCluster { self.set.standbys[0] }

    static let userCount = 500

    /// Prometheus and the blackbox exporter start first and the users come last, so that Prometheus sees every
    /// counter and histogram of the run move from its start (the dashboard's `increase(…[$__range])` panels).
    static func run<T>(rules: String, _ body: (MonitoringStack) async throws -> T) async throws -> T {
        try await withStandbySet("monitoring", standbys: 1) { set in
            try await Fault.migrate(set.primaryURL)
            let primary = FaultDatabase(url: set.primaryURL)
            // The daily time comes from the users' zones (``Fault/dailyTime(_:)``); they are seeded again later.
            try await primary.execute(Self.seedSQL)
            let dailyAt = try await Fault.dailyTime(primary)
            try await primary.execute("TRUNCATE users, user_settings CASCADE")
            let certificate = try await TestCertificate.make("monitoring")
            let (publicPort, internalPort) = (DaemonProcess.freePort(), DaemonProcess.freePort())
            let environment = DaemonProcess.environment(
                databaseURL: set.primaryURL, port: publicPort,
                extra: [
                    "METRICSD_DAILY_AT": dailyAt, "METRICSD_INTERNAL_LISTEN": "127.0.0.1:\(internalPort)",
                    "METRICSD_TLS": "internal", "METRICSD_TLS_CERTIFICATE_FILE": certificate.certificate,
                    "METRICSD_TLS_KEY_FILE": certificate.key, "METRICSD_READ_DATABASE_URL": set.readURL,
                    "METRICSD_READ_MAX_LAG_SECONDS": "1", "METRICSD_RETENTION_DAYS": "3650",
                    // Tracing on, so that its families are on /metrics; no trace is sampled, so nothing is sent.
                    "OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_off",
                    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:\(DaemonProcess.freePort())",
                ])
            return try await Self.withPrometheus(rules: rules, internalPort: internalPort, certificate: certificate) {
                prometheus, started in
                let daemon = try DaemonProcess(environment: environment, port: publicPort)
                defer { daemon.signal(SIGKILL) }
                try await daemon.waitUntilReady()
                let scraped = await DaemonProcess.eventually {
                    !((try? await prometheus.query(#"up{job="metricsd"} == 1"#)) ?? []).isEmpty
                }
                try #require(scraped, "prometheus does not scrape the daemon:\n\(prometheus.log.suffix(2000))")
                try await primary.execute(Self.seedSQL)
                let stack = MonitoringStack(
                    set: set, primary: primary, daemon: daemon, environment: environment, internalPort: internalPort,
                    certificate: certificate, prometheus: prometheus,
                    users: Fault.validUserIDs(Self.userCount, count: 50), started: started)
                return try await stack.withBackgroundReads { try await body(stack) }
            }
        }
    }

    static var seedSQL: String { Fault.seedSQL(count: Self.userCount, zones: ["Asia/Kathmandu", "America/Havana"]) }

    /// The blackbox exporter (module http_2xx, trusting the test certificate) and Prometheus scraping the daemon's
    /// internal listener (job metricsd) and probing its `/readyz` (job metricsd-readyz) with `rules`, both jobs'
    /// targets taken up; `body` gets Prometheus and the instant it started.
    static func withPrometheus<T>(
        rules: String, internalPort: Int, certificate: TestCertificate,
        _ body: (PrometheusServer, ContinuousClock.Instant) async throws -> T
    ) async throws -> T {
        let modules: [String: Any] = [
            "http_2xx": [
                "prober": "http", "timeout": "1s",
                "http": ["preferred_ip_protocol": "ip4", "tls_config": ["ca_file": certificate.certificate]],
            ]
        ]
        return try await withBlackboxExporter("monitoring-blackbox", modules: modules) { blackbox in
            let jobs = [
                PrometheusServer.scrapeJob(
                    "metricsd", target: "127.0.0.1:\(internalPort)", caFile: certificate.certificate),
                PrometheusServer.probeJob(
                    "metricsd-readyz", url: "https://127.0.0.1:\(internalPort)/readyz", exporter: blackbox.address),
            ]
            let started = ContinuousClock.now
            let configuration = MonitoringTests.prometheusConfiguration(rules: rules, jobs: jobs)
            return try await MetricsdTestSupport.withPrometheus("monitoring-prometheus", configuration: configuration) {
                prometheus in
                try await prometheus.waitUntilScraping(["metricsd", "metricsd-readyz"])
                return try await body(prometheus, started)
            }
        }
    }

    /// The work a dashboard shows: the daily units done, the standby in use, a refused read (401) beside the
    /// background's, and a recompute-all (one user's row removed first, so that there is work) run to its end with
    /// `metricsd recompute-all --wait`.
    func computeAndRecompute() async throws {
        let done = await Fault.waitUntil(timeout: .seconds(90)) {
            try await self.primary.int("SELECT count(*) FROM daily_units WHERE state = 'done'") == 2
        }
        try #require(done != nil, "the daily units are not done:\n\(self.daemon.log.suffix(2000))")
        let server = self.set.label(self.standby)
        _ = try await self.whenMetrics("the standby in use") { series in
            PrometheusScrape.value(series, "metricsd_read_server_usable", ["server": server]) == 1
        }
        let refused = try await HTTP.request(port: self.daemon.port, "/v1/profile/metrics/today")
        #expect(refused.status.code == 401)
        try await self.primary.execute("DELETE FROM profile_metrics WHERE user_id = \(self.users[0])")
        let recompute = try await Subprocess.run(
            try DaemonProcess.binary(), ["recompute-all", "--wait"], environment: self.environment)
        #expect(recompute.status == 0, "metricsd recompute-all --wait: \(recompute.output)")
        _ = try await self.whenMetrics("the recompute job's users") { series in
            (PrometheusScrape.value(series, "metricsd_users_examined_total", ["kind": "recompute"]) ?? 0)
                >= Double(Self.userCount)
        }
    }

    /// `/metrics` from the internal listener (TLS, trusting the test certificate), with curl.
    func metricsText() async throws -> String {
        let (status, output, error) = try await Subprocess.capture(
            "/usr/bin/curl",
            [
                "-fsS", "--max-time", "5", "--cacert", self.certificate.certificate,
                "https://127.0.0.1:\(self.internalPort)/metrics",
            ])
        try #require(status == 0, "curl https://127.0.0.1:\(self.internalPort)/metrics (\(status)): \(error)")
        return output
    }

    /// Polls `/metrics` every 100 ms until `condition` holds; the instant it first did.
    func whenMetrics(
        _ what: String, timeout: Duration = .seconds(60), _ condition: @escaping ([String: Double]) -> Bool
    ) async throws -> ContinuousClock.Instant {
        var last: [String: Double] = [:]
        let seen = await Fault.waitUntil(timeout: timeout) {
            last = PrometheusScrape.series(try await self.metricsText())
            return condition(last)
        }
        return try #require(
            seen,
            "\(what): not seen on /metrics within \(timeout); read servers: \(last.filter { $0.key.contains("read_server") })"
        )
    }

    /// Polls `/readyz` (the public listener: the same answer) until it answers `status`; the instant it first did.
    func whenReady(_ status: Int, _ what: String) async throws -> ContinuousClock.Instant {
        let seen = await Fault.waitUntil(timeout: .seconds(60), poll: .milliseconds(50)) {
            try await Int(HTTP.request(port: self.daemon.port, "/readyz").status.code) == status
        }
        return try #require(seen, "\(what): not seen within 60 s:\n\(self.daemon.log.suffix(2000))")
    }

    /// Latest reads answered so far, by status.
    func readCount() async throws -> [String: Int] {
        let series = PrometheusScrape.series(try await self.metricsText())
        var counts: [String: Int] = [:]
        for (key, value) in series
        where key.hasPrefix("metricsd_http_requests_total{") && key.contains("/v1/profile/metrics/today") {
            let status = key.components(separatedBy: "status=\"").last?.prefix(3) ?? "?"
            counts[String(status), default: 0] += Int(value)
        }
        return counts
    }

    /// Runs `body` while one user's latest metrics are read every 200 ms, users in turn.
    func withBackgroundReads<T>(_ body: () async throws -> T) async throws -> T {
        let (port, users) = (self.daemon.port, self.users)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                var index = 0
                while !Task.isCancelled {
                    _ = try? await API.today(port: port, user: users[index % users.count])
                    index += 1
                    try? await Task.sleep(for: .milliseconds(200))
                }
            }
            defer { group.cancelAll() }
            return try await body()
        }
    }

    /// Runs `body` while the primary commits a row every 200 ms: WAL that a paused standby falls behind on.
    func whileCommitting<T>(_ body: () async throws -> T) async throws -> T {
        try await self.primary.execute("CREATE TABLE IF NOT EXISTS monitoring_commits (at timestamptz NOT NULL)")
        let primary = self.primary
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                while !Task.isCancelled {
                    try? await primary.execute("INSERT INTO monitoring_commits VALUES (now())")
                    try? await Task.sleep(for: .milliseconds(200))
                }
            }
            defer { group.cancelAll() }
            return try await body()
        }
    }
}

extension MonitoringTests {
    /// The family names of a `/metrics` text (its `# TYPE` lines).
    static func families(_ text: String) -> Set<String> {
        Set(
            text.split(separator: "\n").compactMap { line -> String? in
                guard line.hasPrefix("# TYPE ") else { return nil }
                let words = line.split(separator: " ")
                return words.count >= 4 ? String(words[2]) : nil
            })
    }
}
