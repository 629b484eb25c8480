import Foundation
import MetricsdTestSupport
import Testing

/// The monitoring package (`systemd/prometheus`: alert rules, Grafana dashboard, runbook, generated from
/// `metricsd-monitoring.yml`) against Debian's Prometheus scraping the real daemon, every second.
///
/// The rules Prometheus loads here are a copy rendered from the same source with every duration divided by
/// ``scale`` (`scripts/gen-monitoring test-copy`): `for:` 15m becomes 15 s, range windows `[10m]` become `[10s]`,
/// offsets likewise. Everything else is the production rule: the same selectors, functions, aggregations and
/// thresholds (a 900 s overdue age, 14 days of certificate, 20 errors). So each scenario proves that the daemon
/// exports what the expression reads and that the expression turns true on the fault and false once it is gone;
/// what the scaling changes is how long Prometheus waits (`for:`) and how much history a rate looks at, both
/// Prometheus's own arithmetic. (A count threshold over a shorter window asks for a higher rate: the scaled
/// MetricsdDatabaseErrorsRising needs 20 errors in 10 s. None of the scenarios' alerts is such a count.)
///
/// Each alert of a scenario must fire within its scaled `for:` plus two scrape intervals and one evaluation interval
/// of the moment the daemon's own `/metrics` or `/readyz` shows the fault (Prometheus sees it at its next scrape, a
/// range window at the one after, and decides at its next evaluation), and must be gone within two scrape
/// intervals and one evaluation interval (plus its range window) of the moment the daemon shows the fault gone.
/// Each scenario prints its times.
@Suite(.serialized) struct MonitoringTests {
    static let scale = 60
    static let scrapeSeconds = 1.0
    /// Both the scrape and the rule evaluation interval.
    static var prometheusTiming: [String: Any] {
        ["scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"]
    }
    /// What Prometheus adds to an expression turning true or false: two scrapes and one evaluation.
    static var reaction: Double { 3 * Self.scrapeSeconds }
    /// The test's own share of a measured time: its polling of the API (100 ms) and of the daemon (100 ms, each look
    /// a curl process on a machine that may be busy).
    static let slack = 1.0

    // MARK: a stalled daily unit

    /// The fault-injecting build stalls the first batch of a unit due an hour ago: MetricsdDailyUnitLate,
    /// MetricsdDailyUnitStalled and MetricsdDailyUsersWaiting fire. The real build started in its place takes the
    /// chunk over once its lease ends and finishes the unit: they resolve, and MetricsdLeaseTakenOver fires for the
    /// takeover and resolves when it leaves its window.
    @Test(.timeLimit(.minutes(3))) func aStalledDailyUnitFiresItsAlertsAndTheyResolve() async throws {
        let package = try await MonitoringPackage.render(scale: Self.scale)
        try await withTestDatabase { testDatabase in
            let database = FaultDatabase(url: testDatabase.url)
            try await database.execute(Fault.seedSQL(count: 500, zones: ["Asia/Kathmandu"]))
            // An hour ago in the users' zone: the unit is late (past MetricsdDailyUnitLate's 900 s) from the start,
            // and the next one is due in 23 hours.
            let dailyAt = try #require(
                try await database.value(
                    "SELECT to_char(now() AT TIME ZONE 'Asia/Kathmandu' - interval '1 hour', 'HH24:MI')"))
            let port = DaemonProcess.freePort()
            let configuration = Self.prometheusConfiguration(
                rules: package.rules, jobs: [PrometheusServer.scrapeJob("metricsd", target: "127.0.0.1:\(port)")])
            try await withPrometheus("monitoring-stall", configuration: configuration) { prometheus in
                try await prometheus.waitUntilScraping(["metricsd"])
                let environment = DaemonProcess.environment(
                    databaseURL: testDatabase.url, port: port,
                    extra: ["METRICSD_DAILY_AT": dailyAt, "METRICSD_LEASE_SECONDS": "3", "METRICSD_WORKERS": "1"])
                try await Self.stallAndRecover(environment, port: port, package: package, prometheus: prometheus)
            }
        }
    }

    static func stallAndRecover(
        _ environment: [String: String], port: Int, package: MonitoringPackage, prometheus: PrometheusServer
    ) async throws {
        let clock = AlertClock(prometheus: prometheus)
        // Every batch waits 10 minutes before its COMMIT: the unit is claimed and never moves.
        var faulty = environment
        faulty["METRICSD_FAULTS"] = "batch-delay-ms=600000"
        let stalled = try DaemonProcess(environment: faulty, port: port)
        defer { stalled.signal(SIGKILL) }
        try await stalled.waitUntilReady()
        let cause = try await Self.whenMetrics(port: port, "the unit stalled") { series in
            (PrometheusScrape.value(series, "metricsd_daily_users_waiting") ?? 0) > 0
                && (PrometheusScrape.value(series, "metricsd_daily_oldest_overdue_unit_age_seconds") ?? 0) > 900
                && PrometheusScrape.value(series, "metricsd_users_examined_total", ["kind": "daily"]) == 0
        }
        let stallAlerts = ["MetricsdDailyUnitLate", "MetricsdDailyUnitStalled", "MetricsdDailyUsersWaiting"]
        let fired = try await clock.waitUntilFiring(stallAlerts, timeout: .seconds(40))
        Self.expectFired(stallAlerts, fired, since: cause, package: package, scenario: "monitoring-stall")

        // The cause removed: the real build in its place, which takes the chunk over when the lease has ended.
        stalled.signal(SIGKILL)
        _ = await stalled.waitForExit()
        let healthy = try DaemonProcess(environment: environment, port: port)
        defer { healthy.signal(SIGKILL) }
        try await healthy.waitUntilReady()
        let removed = try await Self.whenMetrics(port: port, "the unit done") { series in
            PrometheusScrape.value(series, "metricsd_daily_users_waiting") == 0
                && PrometheusScrape.value(series, "metricsd_daily_oldest_overdue_unit_age_seconds") == 0
                && PrometheusScrape.value(series, "metricsd_work_leases_taken_over_total", ["kind": "daily"]) == 1
        }
        let takeover = ["MetricsdLeaseTakenOver"]
        let takeoverFired = try await clock.waitUntilFiring(takeover, timeout: .seconds(20))
        Self.expectFired(
            takeover, takeoverFired, since: removed, package: package, scenario: "monitoring-stall",
            cause: "/metrics showed the takeover")
        let resolved = try await clock.waitUntilResolved(stallAlerts + takeover, timeout: .seconds(40))
        Self.expectResolved(stallAlerts, resolved, since: removed, window: 0, scenario: "monitoring-stall")
        // The takeover's counter rose once: the alert ends when that rise leaves its 15 s window.
        Self.expectResolved(
            takeover, resolved, since: removed, window: 15 * 60 / Double(Self.scale), scenario: "monitoring-stall")
        healthy.signal(SIGTERM)
        #expect(await healthy.waitForExit() == 0)
    }

    // MARK: a healthy run, a lagging standby, a lost database; every expression

    /// One live set-up (``MonitoringStack``): a primary and a standby, the daemon reading from the standby, TLS on
    /// its internal listener, retention on, the blackbox exporter probing `/readyz`. After a daily unit, reads and a
    /// recompute-all: a minute (an hour of production time) with no alert firing; then replay paused on the standby
    /// fires MetricsdReadServerNotUsed and resumed resolves it; the primary stopped fires MetricsdNotReady and
    /// started resolves it. Last, every dashboard panel's expression returns data, every vector selector of every
    /// alert finds series, and every family on `/metrics` is on a panel or in an alert.
    @Test(.timeLimit(.minutes(5))) func silentWhenHealthyFiresOnALaggingStandbyAndALostDatabaseEveryPanelHasData()
        async throws
    {
        let package = try await MonitoringPackage.render(scale: Self.scale)
        try await MonitoringStack.run(rules: package.rules) { stack in
            try await stack.computeAndRecompute()
            await Self.waitUntilQuiet(stack)
            let silence = try await Self.healthyRun(stack, seconds: 60, poll: .seconds(1), label: "monitoring-healthy")
            #expect(silence.firing.isEmpty, "alerts fired in a healthy run: \(silence.firing)")
            try await Self.lagAndResume(stack, package: package)
            try await Self.loseAndRestoreTheDatabase(stack, package: package)
            try await Self.everyExpressionHasData(stack, package: package)
        }
    }

    /// Waits (30 s at most) until no alert is active: the start-up's own (no target up yet) have resolved.
    static func waitUntilQuiet(_ stack: MonitoringStack) async {
        let quiet = await DaemonProcess.eventually(timeout: .seconds(30)) {
            (try? await stack.prometheus.alerts().isEmpty) == true
        }
        let active = quiet ? [] : (try? await stack.prometheus.alerts()) ?? []
        #expect(quiet, "alerts still active before the healthy run: \(active)")
    }

    /// Looks at the active alerts every `poll` for `seconds`; what fired and what was only pending. Prints one line
    /// headed `label`.
    static func healthyRun(_ stack: MonitoringStack, seconds: Int, poll: Duration, label: String) async throws -> (
        firing: Set<String>, pending: Set<String>
    ) {
        let started = ContinuousClock.now
        var firing = Set<String>()
        var pending = Set<String>()
        var looks = 0
        while ContinuousClock.now - started < .seconds(seconds) {
            for alert in try await stack.prometheus.alerts() {
                if alert.state == "firing" { firing.insert(alert.name) } else { pending.insert(alert.name) }
            }
            looks += 1
            try await Task.sleep(for: poll)
        }
        let reads = try await stack.readCount().sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }
        print(
            "\(label): \(seconds) s, \(looks) looks at /api/v1/alerts, firing \(firing.sorted()), pending \(pending.sorted()); latest reads answered so far by status: \(reads)"
        )
        return (firing, pending)
    }

    /// Replay paused on the standby while the primary keeps committing: the daemon leaves it within its 1 s bound.
    static func lagAndResume(_ stack: MonitoringStack, package: MonitoringPackage) async throws {
        let clock = AlertClock(prometheus: stack.prometheus)
        let server = stack.set.label(stack.standby)
        let alert = ["MetricsdReadServerNotUsed"]
        try await stack.whileCommitting {
            try await stack.set.pauseReplay(stack.standby)
            let cause = try await stack.whenMetrics("the standby left") { series in
                PrometheusScrape.value(series, "metricsd_read_server_usable", ["server": server]) == 0
            }
            let fired = try await clock.waitUntilFiring(alert, timeout: .seconds(40))
            Self.expectFired(alert, fired, since: cause, package: package, scenario: "monitoring-standby")
            try await stack.set.resumeReplay(stack.standby)
            let removed = try await stack.whenMetrics("the standby used again") { series in
                PrometheusScrape.value(series, "metricsd_read_server_usable", ["server": server]) == 1
            }
            let resolved = try await clock.waitUntilResolved(alert, timeout: .seconds(30))
            Self.expectResolved(alert, resolved, since: removed, window: 0, scenario: "monitoring-standby")
        }
    }

    /// The primary stopped: `/readyz` answers 503 and the probe fails; started again, the daemon is ready again.
    static func loseAndRestoreTheDatabase(_ stack: MonitoringStack, package: MonitoringPackage) async throws {
        let clock = AlertClock(prometheus: stack.prometheus)
        let alert = ["MetricsdNotReady"]
        try await stack.set.primary.stop()
        let cause = try await stack.whenReady(503, "/readyz 503 with the primary stopped")
        let fired = try await clock.waitUntilFiring(alert, timeout: .seconds(30))
        Self.expectFired(alert, fired, since: cause, package: package, scenario: "monitoring-database")
        let others = try await stack.prometheus.alerts().filter { !alert.contains($0.name) }
        print("monitoring-database: also active while the database was gone: \(others.map(\.description))")
        try await stack.set.primary.start()
        let removed = try await stack.whenReady(200, "/readyz 200 with the primary back")
        let resolved = try await clock.waitUntilResolved(alert, timeout: .seconds(30))
        Self.expectResolved(alert, resolved, since: removed, window: 0, scenario: "monitoring-database")
    }

    /// Every dashboard panel's expression (from the shipped dashboard JSON, its variables filled in as Grafana
    /// would) returns at least one finite value; every vector selector of every alert finds series; every family on
    /// `/metrics` is read by a panel or an alert. Without `strict` it only prints what it found: a healthy run has
    /// no series of the failures the daemon counts from the first one on (`metricsd_work_failures_total`).
    static func everyExpressionHasData(_ stack: MonitoringStack, package: MonitoringPackage, strict: Bool = true)
        async throws
    {
        let range = Int((ContinuousClock.now - stack.started).faultSeconds.rounded(.up))
        var empty: [String] = []
        for (title, expression) in try package.dashboardExpressions() {
            let query = Self.grafanaVariables(expression, range: range)
            let samples = try await stack.prometheus.query(query)
            let finite = samples.filter { $0.value.isFinite }
            print("monitoring-panel: \(title): \(samples.count) series, e.g. \(finite.first?.description ?? "none")")
            if finite.isEmpty { empty.append("\(title): \(query) → \(samples)") }
        }
        #expect(!strict || empty.isEmpty, "panels without data:\n\(empty.joined(separator: "\n"))")
        var missing: [String] = []
        for alert in package.alerts {
            for selector in alert.selectors {
                if try await stack.prometheus.query(selector).isEmpty { missing.append("\(alert.alert): \(selector)") }
            }
        }
        print(
            "monitoring-alerts: \(package.alerts.count) alerts, \(package.alerts.map(\.selectors.count).reduce(0, +)) selectors; without series: \(missing)"
        )
        #expect(
            !strict || missing.isEmpty,
            "alert selectors that find no series (a renamed metric?):\n\(missing.joined(separator: "\n"))")
        let families = Self.families(try await stack.metricsText())
        let shown = package.metricNames()
        let unshown = families.subtracting(shown).sorted()
        #expect(
            !strict || unshown.isEmpty,
            "families on /metrics that no panel or alert reads: \(unshown): add a panel to systemd/prometheus/metricsd-monitoring.yml"
        )
    }

    /// `expression` with the dashboard's variables as Grafana fills them in: all jobs' and instances' values (the
    /// test's job is "metricsd"), $__rate_interval four scrape intervals (Grafana's floor), $__range `range` seconds.
    static func grafanaVariables(_ expression: String, range: Int) -> String {
        expression.replacingOccurrences(of: "$__rate_interval", with: "\(Int(4 * Self.scrapeSeconds))s")
            .replacingOccurrences(of: "$__range", with: "\(range)s")
            .replacingOccurrences(of: "$instance", with: ".*")
            .replacingOccurrences(of: "$job", with: "metricsd")
    }

    // MARK: the healthy run with the production rules (scripts/monitoring-check)

    static let soakMinutes = Int(ProcessInfo.processInfo.environment["METRICSD_MONITORING_SOAK_MINUTES"] ?? "")
    static let soakGate =
        "a healthy run of minutes with the production rules: scripts/monitoring-check sets METRICSD_MONITORING_SOAK_MINUTES"

    /// The live set-up with the committed, unscaled rules for `METRICSD_MONITORING_SOAK_MINUTES` minutes: no alert
    /// fires; then every panel's value is printed.
    @Test(
        .enabled(if: MonitoringTests.soakMinutes != nil, Comment(rawValue: MonitoringTests.soakGate)),
        .timeLimit(.minutes(60)))
    func healthyRunWithTheProductionRules() async throws {
        let minutes = try #require(Self.soakMinutes)
        let package = try await MonitoringPackage.render(scale: 1)
        try await MonitoringStack.run(rules: MonitoringPackage.productionRules) { stack in
            try await stack.computeAndRecompute()
            await Self.waitUntilQuiet(stack)
            var firing = Set<String>()
            for minute in 1...minutes {
                let result = try await Self.healthyRun(
                    stack, seconds: 60, poll: .seconds(5),
                    label: "monitoring-soak: minute \(minute) of \(minutes), production rules")
                firing.formUnion(result.firing)
            }
            #expect(firing.isEmpty, "alerts fired in a healthy run with the production rules: \(firing.sorted())")
            try await Self.everyExpressionHasData(stack, package: package, strict: false)
        }
    }

    // MARK: helpers

    static func prometheusConfiguration(rules: String, jobs: [[String: Any]]) -> [String: Any] {
        ["global": Self.prometheusTiming, "rule_files": [rules], "scrape_configs": jobs]
    }

    /// Polls the daemon's `/metrics` (plain HTTP on `port`) until `condition` holds; the instant it first did.
    static func whenMetrics(
        port: Int, _ what: String, timeout: Duration = .seconds(60), _ condition: @escaping ([String: Double]) -> Bool
    ) async throws -> ContinuousClock.Instant {
        var last: [String: Double] = [:]
        let seen = await Fault.waitUntil(timeout: timeout, poll: .milliseconds(50)) {
            last = PrometheusScrape.series(try await HTTP.request(port: port, "/metrics").text)
            return condition(last)
        }
        return try #require(
            seen,
            "\(what): not seen on /metrics within \(timeout); last: \(last.filter { $0.key.contains("daily") || $0.key.contains("taken_over") })"
        )
    }

    /// Each of `names` fired within its scaled `for:` plus ``reaction`` of `cause`.
    static func expectFired(
        _ names: [String], _ fired: [String: AlertClock.Times], since cause: ContinuousClock.Instant,
        package: MonitoringPackage, scenario: String, cause what: String = "the daemon showed the fault"
    ) {
        for name in names {
            let forSeconds = package.alert(name)?.scaledForSeconds ?? 0
            let bound = forSeconds + Self.reaction + Self.slack
            guard let times = fired[name], let firing = times.firing else {
                Issue.record("\(scenario): \(name) never fired")
                continue
            }
            let seconds = (firing - cause).faultSeconds
            let pending = times.pending.map { String(format: "%.1f", ($0 - cause).faultSeconds) } ?? "-"
            print(
                "\(scenario): \(name) pending +\(pending) s, firing +\(String(format: "%.1f", seconds)) s after \(what) (for: \(String(format: "%g", forSeconds)) s; bound \(String(format: "%.1f", bound)) s)"
            )
            #expect(seconds <= bound, "\(scenario): \(name) fired \(seconds) s after the fault (bound \(bound) s)")
            #expect(
                seconds >= forSeconds - Self.scrapeSeconds, "\(scenario): \(name) fired before its for: (\(seconds) s)")
        }
    }

    /// Each of `names` was gone within ``reaction`` (plus its range `window`) of `removed`.
    static func expectResolved(
        _ names: [String], _ resolved: [String: ContinuousClock.Instant], since removed: ContinuousClock.Instant,
        window: Double, scenario: String
    ) {
        for name in names {
            guard let gone = resolved[name] else {
                Issue.record("\(scenario): \(name) never resolved")
                continue
            }
            let seconds = (gone - removed).faultSeconds
            let bound = window + Self.reaction + Self.slack
            print(
                "\(scenario): \(name) resolved +\(String(format: "%.1f", seconds)) s after the daemon showed the fault gone (bound \(String(format: "%.1f", bound)) s)"
            )
            #expect(
                seconds <= bound,
                "\(scenario): \(name) resolved \(seconds) s after the fault was gone (bound \(bound) s)")
        }
    }
}

/// Times alerts' transitions from `/api/v1/alerts`, polled every 100 ms.
struct AlertClock {
    let prometheus: PrometheusServer

    struct Times {
        var pending: ContinuousClock.Instant?
        var firing: ContinuousClock.Instant?
    }

    /// Waits until every one of `names` is firing; when each was first seen pending and firing (those that never
    /// fired within `timeout` have no firing time).
    func waitUntilFiring(_ names: [String], timeout: Duration) async throws -> [String: Times] {
        var times: [String: Times] = [:]
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let now = ContinuousClock.now
            for alert in try await self.prometheus.alerts() where names.contains(alert.name) {
                if times[alert.name]?.pending == nil { times[alert.name, default: Times()].pending = now }
                if alert.state == "firing" && times[alert.name]?.firing == nil { times[alert.name]?.firing = now }
            }
            if names.allSatisfy({ times[$0]?.firing != nil }) { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        return times
    }

    /// Waits until none of `names` is active; when each was first seen gone.
    func waitUntilResolved(_ names: [String], timeout: Duration) async throws -> [String: ContinuousClock.Instant] {
        var gone: [String: ContinuousClock.Instant] = [:]
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let now = ContinuousClock.now
            let active = Set(try await self.prometheus.alerts().map(\.name))
            for name in names where gone[name] == nil && !active.contains(name) { gone[name] = now }
            if gone.count == names.count { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        return gone
    }
}

/// What `scripts/gen-monitoring test-copy` renders from `systemd/prometheus/metricsd-monitoring.yml`: the rules with
/// durations scaled, and each alert's and panel's expressions with their vector selectors.
struct MonitoringPackage: Decodable {
    struct Alert: Decodable {
        let alert: String
        let severity: String
        let expr: String
        let scaledExpr: String
        let scaledForSeconds: Double
        let selectors: [String]
    }

    struct Panel: Decodable {
        let row: String
        let title: String
        let exprs: [String]
        let metrics: [String]
    }

    let scale: Int
    let rules: String
    let dashboard: String
    let alerts: [Alert]
    let panels: [Panel]

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    /// The committed rules the package installs.
    static var productionRules: String {
        Self.root.appendingPathComponent("systemd/prometheus/metricsd-alerts.yml").path
    }

    /// Runs the generator into a scratch directory and reads what it wrote.
    static func render(scale: Int) async throws -> MonitoringPackage {
        let directory = URL(fileURLWithPath: try scratchFile("README", "scripts/gen-monitoring test-copy\n"))
            .deletingLastPathComponent().path
        let script = Self.root.appendingPathComponent("scripts/gen-monitoring").path
        let (status, output) = try await Subprocess.run(
            "/usr/bin/python3", [script, "test-copy", "--scale", String(scale), directory])
        try #require(status == 0, "scripts/gen-monitoring test-copy failed (\(status)): \(output)")
        let data = try Data(contentsOf: URL(fileURLWithPath: directory + "/monitoring.json"))
        return try JSONDecoder().decode(MonitoringPackage.self, from: data)
    }

    func alert(_ name: String) -> Alert? { self.alerts.first { $0.alert == name } }

    /// Every target of every panel of the shipped dashboard JSON, as (panel title, expression).
    func dashboardExpressions() throws -> [(String, String)] {
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: self.dashboard)))
        let panels = try #require(
            (object as? [String: Any])?["panels"] as? [[String: Any]], "no panels in \(self.dashboard)")
        let expressions = panels.filter { $0["type"] as? String != "row" }.flatMap { panel in
            (panel["targets"] as? [[String: Any]] ?? []).compactMap { target in
                (target["expr"] as? String).map { (panel["title"] as? String ?? "?", $0) }
            }
        }
        #expect(
            Set(expressions.map(\.0)) == Set(self.panels.map(\.title)),
            "the dashboard JSON is not what the source gives: run scripts/gen-monitoring")
        return expressions
    }

    /// The families the panels and alerts read (histogram series by their family's name).
    func metricNames() -> Set<String> {
        let names =
            self.panels.flatMap(\.metrics) + self.alerts.flatMap(\.selectors).map { String($0.prefix { $0 != "{" }) }
        return Set(
            names.map { name in
                for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
                    return String(name.dropLast(suffix.count))
                }
                return name
            })
    }
}
