import CoreMetrics
import Logging
import MetricsdTracing
import NIOCore
import NIOPosix
import Synchronization
import Tracing

/// A small pool of libpq connections whose blocking calls run on a dedicated `NIOThreadPool`, never on Swift's
/// cooperative threads.
///
/// Connections open lazily, one per slot, up to `size`. A caller that finds every slot busy waits up to
/// `acquireTimeout` and then gets `.poolTimeout`, which the HTTP layer turns into a fast 503 instead of an
/// unbounded queue. A connection that breaks (server restart, backend terminated) is dropped and its slot
/// reopened by the next caller, so the pool heals without a restart.
public final class PostgresPool: Sendable {
    public struct Configuration: Sendable {
        /// Most connections open at once. Default 8.
        public var size: Int
        /// How long a caller waits for a free connection before `.poolTimeout`. Default 2 s.
        public var acquireTimeout: TimeAmount
        /// A pooled session older than this is closed instead of used, and a new one opened in its place; nil
        /// keeps sessions for as long as they work. Each PostgreSQL session loads a time zone's rules once and
        /// keeps them, so this bounds how long the daemon goes on with old rules after a tz database update on
        /// the server: every statement runs on a session opened at most this long before it started.
        public var maxSessionAge: Duration?
        /// Whether the pool records `metricsd_db_pool_*` and `metricsd_db_errors_total` (the primary's pool); a read
        /// server's pool does not: its trouble is reported per server (`metricsd_read_server_*`), apart from the
        /// primary's.
        public var recordsMetrics: Bool

        public init(
            size: Int = 8, acquireTimeout: TimeAmount = .seconds(2), maxSessionAge: Duration? = nil,
            recordsMetrics: Bool = true
        ) {
            self.size = size
            self.acquireTimeout = acquireTimeout
            self.maxSessionAge = maxSessionAge
            self.recordsMetrics = recordsMetrics
        }
    }

    public let settings: ConnectionSettings
    public let configuration: Configuration
    /// Runs every blocking libpq call; one thread per connection plus one for a `LISTEN` connection.
    public let threadPool: NIOThreadPool
    private let eventLoop: any EventLoop
    private let state: Mutex<State>
    private let logger: Logger
    private let inUseGauge = Gauge(label: "metricsd_db_pool_connections", dimensions: [("state", "in_use")])
    private let openGauge = Gauge(label: "metricsd_db_pool_connections", dimensions: [("state", "open")])
    private let waitingGauge = Gauge(label: "metricsd_db_pool_waiting_requests")
    private let timeoutCounter = Counter(label: "metricsd_db_errors_total", dimensions: [("kind", "pool_timeout")])
    private let connectErrorCounter = Counter(label: "metricsd_db_errors_total", dimensions: [("kind", "connect")])
    private let lostCounter = Counter(label: "metricsd_db_errors_total", dimensions: [("kind", "connection_lost")])
    private let queryErrorCounter = Counter(label: "metricsd_db_errors_total", dimensions: [("kind", "query")])

    private struct Waiter {
        let id: UInt64
        let continuation: CheckedContinuation<Slot, any Error>
    }

    /// What a caller gets: an open connection, or the right to open one in a free slot.
    private enum Slot {
        case connection(PostgresConnection)
        case open
    }

    private struct State {
        var idle: [PostgresConnection] = []
        var open = 0
        var inUse = 0
        var waiters: [Waiter] = []
        var nextWaiterID: UInt64 = 0
        var closed = false
    }

    public init(settings: ConnectionSettings, configuration: Configuration = .init(), logger: Logger) {
        self.settings = settings
        self.configuration = configuration
        self.threadPool = NIOThreadPool(numberOfThreads: configuration.size + 1)
        self.threadPool.start()
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.any()
        self.state = Mutex(State())
        self.logger = logger
    }

    /// Runs `body` with a connection on the pool's thread pool.
    ///
    /// - Parameters:
    ///   - retryOnConnectionLoss: for statements that are safe to repeat (reads, idempotent upserts): when the
    ///     connection turns out to be broken (the server restarted since it was opened), run once more on a fresh
    ///     connection instead of failing the caller. Never after a statement went unanswered past its deadline: the
    ///     server did not answer, and a second wait would double the caller's.
    ///   - deadline: when the caller stops waiting (a request's bound). Waiting for a free connection and opening
    ///     one end by then (the caller gets `.poolTimeout` or a `.connectionFailed` "no answer from the database";
    ///     a connection still opening is kept for the next caller, and `body` does not run), and each of `body`'s
    ///     statements gets at most what is left of it as its deadline.
    public func withConnection<T: Sendable>(
        retryOnConnectionLoss: Bool = false, deadline: ContinuousClock.Instant? = nil,
        _ body: @escaping @Sendable (PostgresConnection) throws -> T
    ) async throws -> T {
        do {
            return try await self.runOnce(body, deadline: deadline)
        } catch let error as PostgresError
            where retryOnConnectionLoss && error.code == .connectionLost && !error.isUnanswered
            && deadline.map({ ContinuousClock.now < $0 }) ?? true
        {
            // Never on another pooled connection: after a server restart or `pg_terminate_backend` it is as dead
            // as the first one, and the caller (a request, a chunk's failure record) would fail for nothing.
            return try await self.runOnce(body, fresh: true, deadline: deadline)
        }
    }

    /// A request's bound from now (for `withConnection`'s `deadline`): the statement deadline, for everything the
    /// request waits for — a free connection, opening one, its statements; nil when there is no deadline.
    public var requestDeadline: ContinuousClock.Instant? {
        self.settings.statementDeadlineSeconds.map { .now + .nanoseconds(Int64($0 * 1e9)) }
    }

    /// Opens a connection outside the pool (for `LISTEN`), on the pool's thread pool: to the pool's database, or
    /// with `settings` when given (`METRICSD_NOTIFY_DATABASE_URL`).
    public func openDedicatedConnection(settings: ConnectionSettings? = nil) async throws -> PostgresConnection {
        let settings = settings ?? self.settings
        return try await self.threadPool.runIfActive { () throws -> UnsafeTransfer<PostgresConnection> in
            UnsafeTransfer(try PostgresConnection(settings: settings))
        }.value
    }

    /// Runs a blocking call on the pool's thread pool (for a dedicated connection).
    public func runBlocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await self.threadPool.runIfActive(body)
    }

    /// Closes idle connections and fails waiting and future callers with `.poolClosed`.
    public func close() async {
        let (idle, waiters) = self.state.withLock { state in
            state.closed = true
            let idle = state.idle
            state.open -= idle.count
            state.idle = []
            let waiters = state.waiters
            state.waiters = []
            return (UnsafeTransfer(idle), waiters)
        }
        for waiter in waiters {
            waiter.continuation.resume(
                throwing: PostgresError(code: .poolClosed, message: "the database pool is closed"))
        }
        // Drop the last references on a pool thread.
        _ = try? await self.threadPool.runIfActive { _ = idle.value.count }
        try? await self.threadPool.shutdownGracefully()
    }

    /// Connections currently lent out, and callers waiting for one (for `/metrics` and tests).
    public var usage: (inUse: Int, open: Int, waiting: Int) {
        self.state.withLock { ($0.inUse, $0.open, $0.waiters.count) }
    }

    // MARK: Internals

    /// - Parameter fresh: open a new connection even when an idle one is free (the idle one is closed).
    private func runOnce<T: Sendable>(
        _ body: @escaping @Sendable (PostgresConnection) throws -> T, fresh: Bool = false,
        deadline: ContinuousClock.Instant? = nil
    ) async throws -> T {
        let started = ContinuousClock.now
        // Inside a trace: the wait for a connection is a span, and the body's statements are children of the
        // caller's span.
        let trace = Traces.currentContext
        let waiting = trace.flatMap { Traces.startSpan("wait for database connection", parent: $0) }
        let slot: Slot
        do {
            slot = try await self.acquire(deadline: deadline)
            waiting?.end()
        } catch {
            waiting?.setStatus(SpanStatus(code: .error))
            waiting?.set("error.type", .string((error as? PostgresError)?.code.description ?? "error"))
            waiting?.end()
            throw error
        }
        let reusable = self.reusable(slot, fresh: fresh)
        // The slot's old session (not reused) goes with the job, and is closed on the pool thread after it.
        let transfer = UnsafeTransfer((slot, reusable, trace.map { StatementTrace(parent: $0) }))
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let attempt = Attempt(continuation)
            // Only opening a connection can outlast the deadline (a statement has its own): no timer otherwise.
            if let deadline, reusable == nil {
                let budget = Self.seconds(deadline - started)
                attempt.timer = self.eventLoop.scheduleTask(in: .nanoseconds(Self.nanoseconds(deadline - .now))) {
                    attempt.expire(
                        PostgresError(
                            code: .connectionFailed,
                            message: "no answer from the database within \(Self.rounded(budget)) s while connecting"))
                }
            }
            self.threadPool.submit { state in
                guard case .active = state else {
                    self.release(nil)
                    attempt.finish(.failure(PostgresError(code: .poolClosed, message: "the database pool is closed")))
                    return
                }
                withExtendedLifetime(transfer.value.0) {
                    self.work(
                        reusing: transfer.value.1, trace: transfer.value.2, deadline: deadline, attempt: attempt, body)
                }
            }
        }
    }

    /// The blocking part of a call, on a pool thread: the connection (`reusing`, else a new one), then `body`
    /// unless the caller gave up meanwhile; the connection goes back to the pool before the caller is resumed.
    private func work<T: Sendable>(
        reusing reusable: PostgresConnection?, trace: StatementTrace?, deadline: ContinuousClock.Instant?,
        attempt: Attempt<T>, _ body: (PostgresConnection) throws -> T
    ) {
        let connection: PostgresConnection
        do {
            connection = try reusable ?? PostgresConnection(settings: self.settings)
        } catch {
            self.release(nil)
            self.count(error)
            attempt.finish(.failure(error))
            return
        }
        guard attempt.beginBody() else {
            self.release(connection)  // opened for nobody: the next caller gets it
            return
        }
        let configured = connection.statementDeadlineSeconds
        if let deadline {
            // What is left of the caller's bound; never so little that a healthy statement is cut at once.
            let left = max(0.05, Self.seconds(deadline - .now))
            connection.statementDeadlineSeconds = min(configured ?? left, left)
        }
        connection.trace = trace
        let result = Result { try body(connection) }
        connection.trace = nil
        connection.statementDeadlineSeconds = configured
        self.release(connection)
        if case .failure(let error) = result { self.count(error) }
        attempt.finish(result)
    }

    /// The slot's connection when it serves as it is: not `fresh`, not past its maximum age; nil: open a new one.
    private func reusable(_ slot: Slot, fresh: Bool) -> PostgresConnection? {
        guard case .connection(let existing) = slot, !fresh else { return nil }
        guard let maxSessionAge = self.configuration.maxSessionAge,
            existing.openedAt.duration(to: .now) >= maxSessionAge
        else { return existing }
        // Closed when its last reference goes, after the new session is open.
        self.logger.debug(
            "Recycling a database session older than its maximum age",
            metadata: ["metricsd.db_session_max_age_s": "\(maxSessionAge.components.seconds)"])
        return nil
    }

    /// Records a failed call in `metricsd_db_errors_total`; a lost connection also closes the idle ones.
    private func count(_ error: any Error) {
        guard let error = error as? PostgresError else { return }
        let counting = self.configuration.recordsMetrics
        switch error.code {
        case .connectionFailed: if counting { self.connectErrorCounter.increment() }
        case .connectionLost:
            if counting { self.lostCounter.increment() }
            self.closeIdle()
        case .queryFailed: if counting { self.queryErrorCounter.increment() }
        default: break
        }
    }

    /// Closes the idle connections (on the calling pool thread: closing may block): one connection found lost
    /// (server restarted, backends terminated) means the idle ones, opened before, are most likely lost too, and
    /// libpq only notices on their next use, which would fail a batch or a request. Their slots reopen on demand.
    private func closeIdle() {
        let idle = self.state.withLock { state in
            let idle = state.idle
            state.open -= idle.count
            state.idle = []
            return UnsafeTransfer(idle)
        }
        guard !idle.value.isEmpty else { return }
        self.recordGauges()
    }

    /// One call's hand-over between the caller and the pool thread: whoever comes first — the result, or the
    /// caller's deadline while the connection is still being opened — resumes the caller, once.
    private final class Attempt<T: Sendable>: @unchecked Sendable {  // every field is guarded by `state`
        private enum Phase {
            case connecting, running, done
        }

        private struct State {
            var phase = Phase.connecting
            var continuation: CheckedContinuation<T, any Error>?
            var timer: Scheduled<Void>?
        }

        private let state: Mutex<State>

        init(_ continuation: CheckedContinuation<T, any Error>) {
            self.state = Mutex(State(continuation: continuation))
        }

        var timer: Scheduled<Void>? {
            get { self.state.withLock { $0.timer } }
            set { self.state.withLock { $0.timer = newValue } }
        }

        /// The caller's deadline passed: fails it, unless `body` already runs (its statements have their own deadline).
        func expire(_ error: PostgresError) {
            let continuation: CheckedContinuation<T, any Error>? = self.state.withLock { state in
                guard state.phase == .connecting else { return nil }
                state.phase = .done
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.resume(throwing: error)
        }

        /// Whether `body` may run (false: the caller already gave up).
        func beginBody() -> Bool {
            self.state.withLock { state in
                guard state.phase == .connecting else { return false }
                state.phase = .running
                return true
            }
        }

        func finish(_ result: Result<T, any Error>) {
            let (continuation, timer) = self.state.withLock { state in
                let taken = state.phase == .done ? nil : state.continuation
                state.phase = .done
                state.continuation = nil
                defer { state.timer = nil }
                return (taken, state.timer)
            }
            timer?.cancel()
            continuation?.resume(with: result)
        }
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        max(0, duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000)
    }

    /// Two decimals, without trailing zeros.
    static func rounded(_ value: Double) -> String {
        let hundredths = (value * 100).rounded()
        return hundredths.truncatingRemainder(dividingBy: 100) == 0
            ? String(Int(hundredths / 100)) : String(hundredths / 100)
    }

    /// A free connection or slot; waits at most the pool's `acquireTimeout`, and not past `deadline`.
    private func acquire(deadline: ContinuousClock.Instant? = nil) async throws -> Slot {
        var wait = self.configuration.acquireTimeout
        if let deadline { wait = min(wait, .nanoseconds(Self.nanoseconds(deadline - .now))) }
        enum Immediate {
            case slot(Slot)
            case wait
            case closed
        }
        let immediate: Immediate = self.state.withLock { state in
            if state.closed { return .closed }
            if let connection = state.idle.popLast() {
                state.inUse += 1
                return .slot(.connection(connection))
            }
            if state.open < self.configuration.size {
                state.open += 1
                state.inUse += 1
                return .slot(.open)
            }
            return .wait
        }
        switch immediate {
        case .closed: throw PostgresError(code: .poolClosed, message: "the database pool is closed")
        case .slot(let slot):
            self.recordGauges()
            return slot
        case .wait:
            break
        }
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Slot, any Error>) in
            let id: UInt64? = self.state.withLock { state in
                // Re-check under the lock: a connection may have come back meanwhile.
                if let connection = state.idle.popLast() {
                    state.inUse += 1
                    continuation.resume(returning: .connection(connection))
                    return nil
                }
                if state.open < self.configuration.size {
                    state.open += 1
                    state.inUse += 1
                    continuation.resume(returning: .open)
                    return nil
                }
                state.nextWaiterID += 1
                state.waiters.append(Waiter(id: state.nextWaiterID, continuation: continuation))
                return state.nextWaiterID
            }
            self.recordGauges()
            guard let id else { return }
            self.eventLoop.scheduleTask(in: wait) {
                let waiter: Waiter? = self.state.withLock { state in
                    guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.waiters.remove(at: index)
                }
                if let waiter {
                    if self.configuration.recordsMetrics { self.timeoutCounter.increment() }
                    self.recordGauges()
                    waiter.continuation.resume(
                        throwing: PostgresError(
                            code: .poolTimeout, message: "no database connection became free in time"))
                }
            }
        }
    }

    private func release(_ connection: PostgresConnection?) {
        let handOff: (Waiter, Slot)? = self.state.withLock { state in
            state.inUse -= 1
            let usable = connection.map { $0.isHealthy } ?? false
            if !usable || state.closed {
                state.open -= 1
                guard !state.closed, !state.waiters.isEmpty else { return nil }
                let waiter = state.waiters.removeFirst()
                state.open += 1
                state.inUse += 1
                return (waiter, .open)
            }
            if !state.waiters.isEmpty {
                let waiter = state.waiters.removeFirst()
                state.inUse += 1
                return (waiter, .connection(connection!))
            }
            state.idle.append(connection!)
            return nil
        }
        if let (waiter, slot) = handOff {
            waiter.continuation.resume(returning: slot)
        }
        self.recordGauges()
    }

    private func recordGauges() {
        guard self.configuration.recordsMetrics else { return }
        let (inUse, open, waiting) = self.usage
        self.inUseGauge.record(inUse)
        self.openGauge.record(open)
        self.waitingGauge.record(waiting)
    }
}

/// Moves a value that is not `Sendable` across an isolation boundary where the code guarantees exclusive use.
public struct UnsafeTransfer<Wrapped>: @unchecked Sendable {  // the pool lends each connection to one job at a time
    public var value: Wrapped
    public init(_ value: Wrapped) { self.value = value }
}
