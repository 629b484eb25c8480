import MetricsdPostgres
import MetricsdReads

extension PostgresStore {
    /// Runs `body` while this store's batched latest-metrics reads are served (the daemon runs them as a service of
    /// its group; a test runs them beside itself). They stop when `body` returns.
    package func serving<T>(_ body: () async throws -> T) async rethrows -> T {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.readBatches.run() }
            defer { group.cancelAll() }
            return try await body()
        }
    }
}
