import Foundation
import HTTPTypes
import HummingbirdTesting
import Testing

/// A `/metrics` scrape of a running daemon, and the text taken apart: the series, their values, and the families
/// that lack their `# HELP` or `# TYPE`.
package enum PrometheusScrape {
    /// Parses Prometheus text: `name{labels} value` → value, keyed by the whole series text.
    package static func series(_ text: String) -> [String: Double] {
        var values: [String: Double] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else {
                continue
            }
            values[String(line[..<space])] = value
        }
        return values
    }

    /// The value of the series whose name is `name` and whose labels include all of `labels`.
    package static func value(_ series: [String: Double], _ name: String, _ labels: [String: String] = [:]) -> Double? {
        series.first { key, _ in
            (key == name || key.hasPrefix(name + "{"))
                && labels.allSatisfy { key.contains("\($0.key)=\"\($0.value)\"") }
        }?.value
    }

    package static func scrape(_ daemon: DaemonProcess) async throws -> [String: Double] {
        Self.series(try await Self.scrapeText(daemon))
    }

    package static func scrapeText(_ daemon: DaemonProcess) async throws -> String {
        let response = try await daemon.request("/metrics")
        #expect(response.status == .ok)
        #expect(response.headers[.contentType]?.hasPrefix("text/plain; version=0.0.4") == true)
        return response.text
    }

    /// Every family whose samples `text` has but whose `# HELP` (non-empty) or `# TYPE` line it lacks, as
    /// "name: what is missing". Histogram samples (`_bucket`, `_sum`, `_count`) belong to their family.
    package static func undocumentedFamilies(_ text: String) -> [String] {
        var help = Set<String>()
        var types: [String: String] = [:]
        var sampled = Set<String>()
        for line in text.split(separator: "\n") {
            let words = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
            if line.hasPrefix("# HELP "), words.count == 4, !words[3].trimmingCharacters(in: .whitespaces).isEmpty {
                help.insert(String(words[2]))
            } else if line.hasPrefix("# TYPE "), words.count >= 4 {
                types[String(words[2])] = String(words[3])
            } else if !line.hasPrefix("#") {
                let name = String(line.prefix { $0 != "{" && $0 != " " })
                sampled.insert(name)
            }
        }
        var problems: [String] = []
        for name in sampled.sorted() {
            var family = name
            for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
                let base = String(name.dropLast(suffix.count))
                if types[base] == "histogram" { family = base }
            }
            if !help.contains(family) { problems.append("\(family): no # HELP") }
            if types[family] == nil { problems.append("\(family): no # TYPE") }
        }
        return problems
    }
}
