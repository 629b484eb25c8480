import MetricsdDaemon
import MetricsdHTTP
import Foundation

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
                return index == cells.count - 1 ? text : text.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }.joined(separator: "  ")
        }
        return ([line(header)] + rows.map(line)).joined(separator: "\n")
    }
}
