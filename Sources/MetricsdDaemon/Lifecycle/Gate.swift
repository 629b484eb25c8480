import ServiceLifecycle
import Synchronization

/// A door that starts closed and opens once; whoever waits at it goes on when it opens. Every start-up ordering of
/// the daemon is a gate: the database prepared, the listener bound, the service ready.
///
/// Waiting suspends (no polling) and gives up when the waiting task is cancelled or its service is asked to shut
/// down gracefully, so a gated service never outlives a start-up that failed.
package final class Gate: Sendable {
    private struct State {
        var isOpen = false
        var nextID: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Bool, Never>] = [:]
        /// Waiters that gave up before their continuation was registered.
        var abandoned: Set<UInt64> = []
    }

    private let state = Mutex(State())

    package init() {}

    package var isOpen: Bool { self.state.withLock { $0.isOpen } }

    /// Opens the gate (once; later calls do nothing) and wakes every waiter.
    package func open() {
        let waiters = self.state.withLock { state in
            state.isOpen = true
            defer { state.waiters = [:] }
            return state.waiters.values
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// Waits until the gate opens: true. False when the task is cancelled or its service is asked to shut down
    /// gracefully first.
    package func wait() async -> Bool {
        let id: UInt64? = self.state.withLock { state in
            if state.isOpen { return nil }
            state.nextID &+= 1
            return state.nextID
        }
        guard let id else { return true }
        return await withGracefulShutdownHandler {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                    let answer: Bool? = self.state.withLock { state in
                        if state.isOpen { return true }
                        if state.abandoned.remove(id) != nil { return false }
                        state.waiters[id] = continuation
                        return nil
                    }
                    if let answer { continuation.resume(returning: answer) }
                }
            } onCancel: {
                self.abandon(id)
            }
        } onGracefulShutdown: {
            self.abandon(id)
        }
    }

    private func abandon(_ id: UInt64) {
        let waiter: CheckedContinuation<Bool, Never>? = self.state.withLock { state in
            if let waiter = state.waiters.removeValue(forKey: id) { return waiter }
            if !state.isOpen { state.abandoned.insert(id) }
            return nil
        }
        waiter?.resume(returning: false)
    }
}
