import MetricsdPostgres
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// When the scheduler loop last went round, read by the watchdog: pings stop when it is stale.
public final class Liveness: Sendable {
    private let lastBeat = Atomic<Int64>(0)
    private let clock = ContinuousClock()
    private let origin: ContinuousClock.Instant

    public init() {
        self.origin = ContinuousClock.now
        self.beat()
    }

    /// The scheduler loop is alive now.
    public func beat() {
        self.lastBeat.store(self.nanoseconds(), ordering: .relaxed)
    }

    /// Time since the last beat.
    public var age: Duration {
        .nanoseconds(self.nanoseconds() - self.lastBeat.load(ordering: .relaxed))
    }

    private func nanoseconds() -> Int64 {
        let elapsed = self.clock.now - self.origin
        return elapsed.components.seconds * 1_000_000_000 + elapsed.components.attoseconds / 1_000_000_000
    }
}

/// Wakes sleeping workers when work may be available (a unit was enqueued, a job was triggered).
public final class WorkSignal: Sendable {
    private struct State {
        var nextID: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        /// Ids woken before their continuation was registered.
        var fired: Set<UInt64> = []
    }
    private let state = Mutex(State())

    public init() {}

    /// Wakes every current waiter.
    public func notify() {
        let waiters = self.state.withLock { state in
            let waiters = state.waiters
            state.waiters = [:]
            return waiters
        }
        for waiter in waiters.values { waiter.resume() }
    }

    /// Waits for `notify()` or `timeout`, whichever comes first; returns early on cancellation.
    public func wait(timeout: Duration) async {
        let id = self.state.withLock { state in
            state.nextID &+= 1
            return state.nextID
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let fired = self.state.withLock { state in
                        if state.fired.remove(id) != nil { return true }
                        state.waiters[id] = continuation
                        return false
                    }
                    if fired { continuation.resume() }
                }
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
            }
            await group.next()
            group.cancelAll()
            self.wake(id)
        }
        self.state.withLock { _ = $0.fired.remove(id) }
    }

    private func wake(_ id: UInt64) {
        let continuation: CheckedContinuation<Void, Never>? = self.state.withLock { state in
            if let continuation = state.waiters.removeValue(forKey: id) { return continuation }
            state.fired.insert(id)
            return nil
        }
        continuation?.resume()
    }
}
