import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Plain aligned columns for terminal output.
enum TextTable {
    static func render(header: [String], rows: [[String]]) -> String {
        var widths = header.map(\.count)
        for row in rows {
            for (index, cell) in row.enumerated() where index < widths.count {
                widths[index] = max(widths[index], min(cell.count, 60))
            }
        }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { index, cell in
                let text = cell.count > 60 && index < cells.count - 1 ? String(cell.prefix(59)) + "…" : cell
                return index == cells.count - 1 ? text : text.padded(to: widths[index])
            }.joined(separator: "  ")
        }
        return ([line(header)] + rows.map(line)).joined(separator: "\n")
    }
}
