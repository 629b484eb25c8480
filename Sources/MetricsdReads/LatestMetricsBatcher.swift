import HealthMetrics
import MetricsdPostgres
import MetricsdTracing
import MetricsdWork
import ServiceLifecycle
import Synchronization
import Tracing

/// Coalesces concurrent latest-metrics reads into one statement per batch (`SQL.latestMetricsBatch`).
///
/// Under load, requests for different users arrive faster than one statement per request can be sent. A batch of
/// k users costs PostgreSQL one round trip, one executor start-up and k probes of `profile_metrics_latest`'s primary
/// key instead of k of each, and costs metricsd one hop to a pool thread instead of k. With little load every
/// batch holds one user: the latency of a single statement, plus the wake-up of a sleeping runner.
///
/// At most `maxRunners` batches run at once (the rest of the pool stays free for acknowledgements, on-demand
/// computation and the scheduler); a request that finds every runner busy waits for the next batch.
///
/// The batches run in ``run()``, a service of the daemon's group: `maxRunners` loops that sleep while nobody
/// waits. One is woken whenever someone waits, another only when a whole batch waits for it: fewer, fuller batches
/// cost less per read (one statement, one hop to a pool thread, one wake-up each); more runners only help once a
/// single one cannot keep up. On graceful shutdown the runners finish what waits and stop; a read asked for after
/// that fails at once with `poolClosed`.
package final class LatestMetricsBatcher: Service, Sendable {
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

    /// A read waiting: whose, how to answer it, when it was asked (its bound runs from then), and its request's
    /// span context and wait span when traced.
    private typealias Waiter = (
        userID: Int64, resumption: Resumption, asked: ContinuousClock.Instant,
        trace: (request: ServiceContext, wait: MetricsdSpan)?
    )

    private struct State {
        var pending: [Waiter] = []
        /// Runners not asleep (working, or woken and about to work).
        var active: Int
        /// Sleeping runners; resumed with true to work, false to stop.
        var sleeping: [CheckedContinuation<Bool, Never>] = []
        var stopping = false
    }

    private let pool: PostgresPool
    /// Where the reads go when read servers are configured (else the pool, the primary).
    private let replicas: ReadReplicas?
    private let maxRunners: Int
    private let maxBatch: Int
    private let state: Mutex<State>

    init(pool: PostgresPool, replicas: ReadReplicas? = nil, maxRunners: Int, maxBatch: Int = 128) {
        self.pool = pool
        self.replicas = replicas
        self.maxRunners = max(1, maxRunners)
        self.maxBatch = max(1, maxBatch)
        self.state = Mutex(State(active: self.maxRunners))
    }

    /// The runners, until the group shuts down gracefully (or the task is cancelled). May run again after it
    /// returned (a test serving several times from one store): each run starts with every runner awake.
    package func run() async {
        self.state.withLock { state in
            state.stopping = false
            state.active = self.maxRunners
        }
        await withDiscardingTaskGroup { group in
            for _ in 0..<self.maxRunners {
                group.addTask { await self.runner() }
            }
            group.addTask {
                try? await gracefulShutdown()
                self.stop()
            }
        }
    }

    func load(userID: Int64) async throws -> LatestMetrics? {
        let trace = Self.waitSpan()
        return try await withCheckedThrowingContinuation { continuation in
            self.enqueue((userID, .continuation(continuation), .now, trace))
        }
    }

    /// The same read for a caller outside Swift concurrency: `completion` runs once, on whichever thread finished
    /// the batch. Never runs the statement on the caller's thread (an event loop must not block).
    func load(userID: Int64, completion: @escaping Completion) {
        self.enqueue((userID, .callback(completion), .now, Self.waitSpan()))
    }

    /// The caller's span context and a wait span, child of it, when inside a trace (the task's, or the one the
    /// HTTP dispatcher binds around a callback handler).
    private static func waitSpan() -> (request: ServiceContext, wait: MetricsdSpan)? {
        guard let request = Traces.currentContext, let wait = Traces.startSpan("wait for read batch", parent: request)
        else { return nil }
        return (request, wait)
    }

    /// Answers a waiter (its wait is over, if it was not yet).
    private static func answer(_ waiter: Waiter, _ result: Result<LatestMetrics?, any Error>) {
        waiter.trace?.wait.end()
        waiter.resumption.resume(result)
    }

    /// Where a batch's statement belongs in the trace: a child of the first sampled request's span (else the
    /// first traced one), linked to every other traced request's span; ends their waits. Nil: none is traced.
    ///
    /// A batch's statement never carries the sqlcommenter comment, sampled or not, on the primary and on a read
    /// server alike: it serves every request of the batch, and a comment would make its text unique, so it would
    /// be sent unnamed and parsed and planned again — for every request in the batch, whenever any one of them is
    /// sampled (with a dozen requests a batch at 1 % sampling, one batch in ten or more). The trace is whole
    /// without it: the statement's span is a child of one request's span and linked to the others'.
    private static func statementTrace(_ waiters: [Waiter]) -> StatementTrace? {
        let traced = waiters.compactMap(\.trace)
        guard !traced.isEmpty else { return nil }
        for trace in traced { trace.wait.end() }
        let parent = traced.firstIndex { Traces.isSampled($0.request) } ?? 0
        return StatementTrace(
            parent: traced[parent].request, links: traced.indices.filter { $0 != parent }.map { traced[$0].request },
            comment: .never)
    }

    private enum Enqueued {
        case waiting
        case wake(CheckedContinuation<Bool, Never>)
        case refused
    }

    private func enqueue(_ waiter: Waiter) {
        let outcome: Enqueued = self.state.withLock { state in
            if state.stopping && state.active == 0 { return .refused }
            state.pending.append(waiter)
            guard !state.sleeping.isEmpty,
                state.active == 0 || (state.active < self.maxRunners && state.pending.count >= self.maxBatch)
            else { return .waiting }
            state.active += 1
            return .wake(state.sleeping.removeLast())
        }
        switch outcome {
        case .waiting: break
        case .wake(let runner): runner.resume(returning: true)
        case .refused: Self.answer(waiter, .failure(PostgresError(code: .poolClosed, message: "shutting down")))
        }
    }

    /// Runs batches while anyone waits, sleeps while nobody does, until stopped.
    private func runner() async {
        while true {
            let batch = self.state.withLock { Self.take(&$0.pending, upTo: self.maxBatch) }
            if !batch.isEmpty {
                await self.execute(batch)
                continue
            }
            let goOn = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let now: Bool? = self.state.withLock { state in
                    if !state.pending.isEmpty { return true }  // work arrived meanwhile: stay awake
                    state.active -= 1
                    if state.stopping { return false }
                    state.sleeping.append(continuation)
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
            guard goOn else { return }
        }
    }

    /// Wakes every sleeping runner to stop; working runners stop once nothing waits.
    private func stop() {
        let sleeping = self.state.withLock { state in
            state.stopping = true
            defer { state.sleeping = [] }
            return state.sleeping
        }
        for runner in sleeping { runner.resume(returning: false) }
    }

    /// When the first of `waiters` stops waiting: its bound, the primary's statement deadline, from when it asked
    /// (nil: no deadline). No read waits longer, however long it queued for a runner or a connection: a database
    /// that does not answer costs each read its bound, not the sum of the waits before it.
    private func deadline(of waiters: [Waiter]) -> ContinuousClock.Instant? {
        guard let bound = self.pool.settings.statementDeadlineSeconds,
            let first = waiters.min(by: { $0.asked < $1.asked })
        else { return nil }
        return first.asked + .nanoseconds(Int64(bound * 1e9))
    }

    /// One statement for the waiters' users; resumes every waiter. On the primary, the batches that arrive
    /// meanwhile run on the same pool thread and connection (see ``drain(_:)``).
    private func execute(_ waiters: [Waiter]) async {
        guard let replicas = self.replicas else {
            await self.drain(waiters)
            return
        }
        let unique = Array(Set(waiters.map(\.userID)))
        do {
            let trace = Self.statementTrace(waiters)
            // The wait for a connection belongs to the statement's parent request; the statement, wherever it
            // runs, is linked to the others as on the primary.
            let found = try await ServiceContext.$current.withValue(trace?.parent) {
                try await replicas.read(userIDs: unique, deadline: self.deadline(of: waiters), trace: trace)
            }
            for waiter in waiters { Self.answer(waiter, .success(found[waiter.userID])) }
        } catch {
            for waiter in waiters { Self.answer(waiter, .failure(error)) }
        }
    }

    /// The most batches one runner runs on a connection before giving it back to the pool (which then recycles
    /// a session past its maximum age, and lets the other callers waiting for a connection have their turn).
    static let batchesPerConnection = 64

    /// Runs `first`, then each batch that waits once it is done, on one pool thread and one connection, until
    /// nobody waits (or ``batchesPerConnection``). Under load this is the whole cost of a batch: the statement
    /// and one hop per waiter back to its event loop, instead of two more hops between Swift's threads and the
    /// pool's for every batch. A batch whose statement fails on a lost connection runs once more on a fresh one
    /// (the pool's retry; the batches already answered are not repeated); any other failure fails that batch.
    /// Each batch's statement waits at most until its first waiter's deadline (``deadline(of:)``).
    private func drain(_ first: [Waiter]) async {
        let current = Current(first)
        let maxBatch = self.maxBatch
        let configured = self.pool.settings.statementDeadlineSeconds
        do {
            try await self.pool.withConnection(retryOnConnectionLoss: true, deadline: self.deadline(of: first)) {
                connection in
                for _ in 0..<Self.batchesPerConnection {
                    let waiters = current.batch.withLock { $0 }
                    if waiters.isEmpty { return }
                    if let configured, let deadline = self.deadline(of: waiters) {
                        connection.statementDeadlineSeconds = min(configured, max(0.05, Self.seconds(deadline - .now)))
                    }
                    connection.trace = Self.statementTrace(waiters)
                    let found = try PostgresStore.readLatest(userIDs: Array(Set(waiters.map(\.userID))), on: connection)
                    connection.trace = nil
                    for waiter in waiters { Self.answer(waiter, .success(found[waiter.userID])) }
                    let next = self.state.withLock { Self.take(&$0.pending, upTo: maxBatch) }
                    current.batch.withLock { $0 = next }
                }
            }
        } catch {
            for waiter in current.batch.withLock({ $0 }) { Self.answer(waiter, .failure(error)) }
            return
        }
        // Batches taken on the last turn and not run yet: run them on the next connection.
        let left = current.batch.withLock { $0 }
        if !left.isEmpty { await self.drain(left) }
    }

    /// The batch a drain is running or about to run, where its failure handler finds it.
    private final class Current: Sendable {
        let batch: Mutex<[Waiter]>
        init(_ batch: [Waiter]) { self.batch = Mutex(batch) }
    }

    private static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    private static func take(_ pending: inout [Waiter], upTo count: Int) -> [Waiter] {
        let taken = Array(pending.prefix(count))
        pending.removeFirst(taken.count)
        return taken
    }
}
