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
    typealias Completion = @Sendable (Result<LatestMetrics?, any Error>) -> Void

    /// How a waiter gets its answer: a suspended task, or a callback (the HTTP hot path, outside Swift concurrency).
    private enum Resumption {
        case continuation(CheckedContinuation<LatestMetrics?, any Error>)
        case callback(Completion)

        func resume(_ result: Result<LatestMetrics?, any Error>) {
            switch self {
            case .continuation(let continuation): continuation.resume(with: result)
            case .callback(let completion): completion(result)
            }
        }
    }

    private typealias Waiter = (userID: Int64, resumption: Resumption)

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
            guard self.mayStartRunner(state, waiting: state.pending.count + 1) else { return nil }
            state.runners += 1
            return Self.take(&state.pending, upTo: self.maxBatch - 1)
        }
        if let others {
            // This request runs a batch itself: its own user and whoever was waiting.
            defer { self.finishRun() }
            return try await self.execute(others, plus: userID)
        }
        return try await withCheckedThrowingContinuation { continuation in
            self.enqueue((userID, .continuation(continuation)))
        }
    }

    /// The same read for a caller outside Swift concurrency: `completion` runs once, on whichever thread finished
    /// the batch. Never runs the statement on the caller's thread (an event loop must not block).
    func load(userID: Int64, completion: @escaping Completion) {
        self.enqueue((userID, .callback(completion)))
    }

    private func enqueue(_ waiter: Waiter) {
        let startRunner = self.state.withLock { state in
            state.pending.append(waiter)
            // Re-checked with the append: a runner that found nothing pending may have left meanwhile.
            guard self.mayStartRunner(state, waiting: state.pending.count) else { return false }
            state.runners += 1
            return true
        }
        if startRunner { Task { await self.drain() } }
    }

    /// One runner whenever someone waits; another only when a whole batch waits for it (up to `maxRunners`).
    /// Fewer, fuller batches cost less per read (one statement, one hop to a pool thread, one wake-up each);
    /// more runners only help once a single one cannot keep up.
    private func mayStartRunner(_ state: State, waiting: Int) -> Bool {
        state.runners == 0 || (state.runners < self.maxRunners && waiting >= self.maxBatch)
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
            for waiter in waiters { waiter.resumption.resume(.failure(error)) }
            throw error
        }
        for waiter in waiters { waiter.resumption.resume(.success(found[waiter.userID])) }
        return own.flatMap { found[$0] }
    }

    private static func take(_ pending: inout [Waiter], upTo count: Int) -> [Waiter] {
        let taken = Array(pending.prefix(count))
        pending.removeFirst(taken.count)
        return taken
    }
}
