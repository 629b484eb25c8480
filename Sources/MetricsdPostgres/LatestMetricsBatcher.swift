import HealthMetrics
import Synchronization

/// Coalesces concurrent latest-metrics reads into one statement per batch (`SQL.latestMetricsBatch`).
///
/// Under load, requests for different users arrive faster than one statement per request can be sent. A batch of
/// k users costs PostgreSQL one round trip, one executor start-up and k probes of the `(user_id, computed_at DESC)`
/// index instead of k of each, and costs metricsd one hop to a pool thread instead of k. With little load every
/// batch holds one user, run by the request itself: the latency of a single statement, and no extra task.
///
/// At most `maxRunners` batches run at once (the rest of the pool stays free for acknowledgements, on-demand
/// computation and the scheduler); a request that finds every runner busy waits for the next batch.
final class LatestMetricsBatcher: Sendable {
    private typealias Waiter = (userID: Int64, continuation: CheckedContinuation<LatestMetrics?, any Error>)

    private struct State {
        var pending: [Waiter] = []
        var runners = 0
    }

    private let pool: PostgresPool
    private let maxRunners: Int
    private let maxBatch: Int
    private let state = Mutex(State())

    init(pool: PostgresPool, maxRunners: Int, maxBatch: Int = 128) {
        self.pool = pool
        self.maxRunners = max(1, maxRunners)
        self.maxBatch = max(1, maxBatch)
    }

    func load(userID: Int64) async throws -> LatestMetrics? {
        let others: [Waiter]? = self.state.withLock { state in
            guard state.runners < self.maxRunners else { return nil }
            state.runners += 1
            return Self.take(&state.pending, upTo: self.maxBatch - 1)
        }
        if let others {
            // This request runs a batch itself: its own user and whoever was waiting.
            defer { self.finishRun() }
            return try await self.execute(others, plus: userID)
        }
        return try await withCheckedThrowingContinuation { continuation in
            let startRunner = self.state.withLock { state in
                state.pending.append((userID, continuation))
                // Re-checked with the append: a runner that found nothing pending may have left meanwhile.
                guard state.runners < self.maxRunners else { return false }
                state.runners += 1
                return true
            }
            if startRunner { Task { await self.drain() } }
        }
    }

    /// Runs batches until nobody waits.
    private func drain() async {
        while true {
            let batch: [Waiter]? = self.state.withLock { state in
                if state.pending.isEmpty {
                    state.runners -= 1
                    return nil
                }
                return Self.take(&state.pending, upTo: self.maxBatch)
            }
            guard let batch else { return }
            _ = try? await self.execute(batch, plus: nil)
        }
    }

    /// After a request ran a batch itself: hands the runner's place to a task when others wait, else gives it up.
    private func finishRun() {
        let handOver = self.state.withLock { state in
            if state.pending.isEmpty {
                state.runners -= 1
                return false
            }
            return true
        }
        if handOver { Task { await self.drain() } }
    }

    /// One statement for the waiters' users (and `own`); resumes every waiter; returns `own`'s metrics.
    private func execute(_ waiters: [Waiter], plus own: Int64?) async throws -> LatestMetrics? {
        var userIDs = waiters.map(\.userID)
        if let own { userIDs.append(own) }
        let unique = Array(Set(userIDs))
        let found: [Int64: LatestMetrics]
        do {
            found = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
                try PostgresStore.readLatest(userIDs: unique, on: connection)
            }
        } catch {
            for waiter in waiters { waiter.continuation.resume(throwing: error) }
            throw error
        }
        for waiter in waiters { waiter.continuation.resume(returning: found[waiter.userID]) }
        return own.flatMap { found[$0] }
    }

    private static func take(_ pending: inout [Waiter], upTo count: Int) -> [Waiter] {
        let taken = Array(pending.prefix(count))
        pending.removeFirst(taken.count)
        return taken
    }
}
