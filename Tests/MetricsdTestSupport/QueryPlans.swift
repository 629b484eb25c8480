import Foundation
import MetricsdPostgres

extension TestDatabase {
    /// `EXPLAIN` of a statement, with its parameters bound through a prepared statement (the generic plan when
    /// `generic`; run, with its buffers, when `analyze`), as the lines PostgreSQL prints.
    package func plan(
        _ statement: String, parameters: [String?] = [], generic: Bool = false, analyze: Bool = false
    ) async throws -> String {
        try await self.pool.withConnection { connection in
            try connection.execute("SET plan_cache_mode = \(generic ? "force_generic_plan" : "auto")")
            defer { _ = try? connection.execute("DEALLOCATE ALL; RESET plan_cache_mode") }
            guard !parameters.isEmpty else {
                let result = try connection.query("EXPLAIN " + statement)
                return (0..<result.rowCount).compactMap { result.string($0, 0) }.joined(separator: "\n")
            }
            try connection.query("PREPARE checked AS " + statement)
            let values = parameters.map {
                $0.map { "'" + $0.replacingOccurrences(of: "'", with: "''") + "'" } ?? "NULL"
            }
            let explain = analyze ? "EXPLAIN (ANALYZE, BUFFERS)" : "EXPLAIN"
            let result = try connection.query("\(explain) EXECUTE checked(\(values.joined(separator: ", ")))")
            return (0..<result.rowCount).compactMap { result.string($0, 0) }.joined(separator: "\n")
        }
    }
}
