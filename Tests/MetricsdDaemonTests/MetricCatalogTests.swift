import CoreMetrics
import Foundation
import MetricsdTestSupport
import Prometheus
import Testing

@testable import MetricsdDaemon
@testable import MetricsdHTTP
@testable import MetricsdWork

/// `/metrics` by convention: every family has `# HELP` and `# TYPE`, base units, `_total` counters, and every
/// name the code records is documented in `MetricCatalog`.
@Suite struct MetricCatalogTests {
    /// Every catalogue entry made through the factory (with made-up label values) and exposed.
    static func exposition() -> String {
        let registry = PrometheusCollectorRegistry()
        let factory = DocumentedMetricsFactory(registry: registry)
        for entry in MetricCatalog.entries {
            let dimensions = entry.labels.map { ($0, "x") }
            switch entry.kind {
            case .counter: CoreMetrics.Counter(label: entry.name, dimensions: dimensions, factory: factory).increment()
            case .gauge: CoreMetrics.Gauge(label: entry.name, dimensions: dimensions, factory: factory).record(1)
            case .histogram:
                CoreMetrics.Timer(label: entry.name, dimensions: dimensions, factory: factory).recordMilliseconds(3)
            }
        }
        return registry.emitToString()
    }

    @Test func everySeriesHasHelpAndType() throws {
        let text = Self.exposition()
        #expect(PrometheusScrape.undocumentedFamilies(text) == [])
        for entry in MetricCatalog.entries {
            #expect(text.contains("# HELP \(entry.name) \(entry.help)\n"), "\(entry.name)")
            #expect(text.contains("# TYPE \(entry.name) \(entry.kind.rawValue)\n"), "\(entry.name)")
        }
    }

    /// The lateness histogram's label: the zone's UTC offset at the due instant, signed, hours and minutes.
    @Test(arguments: [
        (0, "+00:00"), (20_700, "+05:45"), (-12_600, "-03:30"), (50_400, "+14:00"), (-43_200, "-12:00"),
        (45_900, "+12:45"), (-1_800, "-00:30"),
    ])
    func utcOffsetLabels(seconds: Int, label: String) {
        #expect(OperatorMetrics.utcOffsetLabel(seconds) == label)
    }

    @Test func aNameMissingFromTheCatalogueIsReported() {
        let registry = PrometheusCollectorRegistry()
        CoreMetrics.Counter(
            label: "metricsd_not_documented_total", factory: DocumentedMetricsFactory(registry: registry)
        ).increment()
        #expect(
            PrometheusScrape.undocumentedFamilies(registry.emitToString()) == [
                "metricsd_not_documented_total: no # HELP"
            ])
    }

    @Test func namesFollowTheConventions() {
        for entry in MetricCatalog.entries {
            let name = entry.name
            #expect(name.hasPrefix("metricsd_"), "\(name)")
            #expect(name.allSatisfy { $0.isLowercase || $0.isNumber || $0 == "_" }, "\(name): snake_case")
            #expect(
                entry.kind == .counter ? name.hasSuffix("_total") : !name.hasSuffix("_total"),
                "\(name): _total iff counter")
            if entry.kind == .histogram { #expect(name.hasSuffix("_seconds"), "\(name): a histogram of seconds") }
            for unit in ["_ms", "_millis", "milliseconds", "_minutes", "_hours", "_kb", "_mb"] {
                #expect(!name.contains(unit), "\(name): base units (seconds, bytes)")
            }
            #expect(entry.help.count > 20 && entry.help.hasSuffix("."), "\(name): help is a sentence")
            #expect(entry.kind == .histogram ? !entry.buckets.isEmpty : entry.buckets.isEmpty, "\(name): buckets")
        }
        #expect(Set(MetricCatalog.entries.map(\.name)).count == MetricCatalog.entries.count, "one entry per name")
    }

    /// The names in `label: "metricsd_…"` across Sources/ are exactly the catalogue's.
    @Test func theCatalogueCoversEveryNameTheCodeRecords() throws {
        let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Sources")
        let files = try #require(FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil))
        let pattern = try Regex(#"label:\s*"(metricsd_[a-z0-9_]+)""#)
        var recorded = Set<String>()
        for case let file as URL in files where file.pathExtension == "swift" {
            let text = try String(contentsOf: file, encoding: .utf8)
            for match in text.matches(of: pattern) {
                if let name = match.output[1].substring { recorded.insert(String(name)) }
            }
        }
        #expect(recorded.count > 15, "found \(recorded.count) names under \(sources.path)")
        let catalogue = Set(MetricCatalog.entries.map(\.name))
        #expect(recorded.subtracting(catalogue).sorted() == [], "recorded but not in MetricCatalog")
        #expect(catalogue.subtracting(recorded).sorted() == [], "in MetricCatalog but never recorded")
    }
}
