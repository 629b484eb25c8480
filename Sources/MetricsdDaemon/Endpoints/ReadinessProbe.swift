import HealthMetrics
import Synchronization

/// `/readyz` answered from at most one database probe a second, however many clients ask.
///
/// The probe is a transaction that writes WAL (see `PostgresStore.readiness`): a load balancer, a monitoring
/// system and a misbehaving client asking back to back must not turn it into a write load. A "ready" result is
/// reused for `maxAge`; a "not ready" one is not (the next request probes again, so recovery shows at once; a
/// probe that fails writes nothing). While a probe runs, every request that needs a fresh result waits for that
/// same probe: one in flight, never a queue of probes. The reply says how old its result is (`ageSeconds`).
final class ReadinessProbe: Sendable {
    typealias Result = (readiness: Readiness, at: ContinuousClock.Instant)

    private struct State {
        var last: Result?
        /// Requests waiting for the probe in flight; nil when none is.
        var waiting: [CheckedContinuation<Result, Never>]?
    }

    private let store: any MetricsStore
    private let maxAge: Duration
    private let state = Mutex(State())

    init(store: any MetricsStore, maxAge: Duration = .seconds(1)) {
        self.store = store
        self.maxAge = maxAge
    }

    /// The current readiness and the instant it was measured.
    func current() async -> Result {
        enum Step {
            case answer(Result)
            case wait
            case probe
        }
        let now = ContinuousClock.now
        let step: Step = self.state.withLock { state in
            if let last = state.last, last.readiness.isReady, now - last.at < self.maxAge { return .answer(last) }
            if state.waiting != nil { return .wait }
            state.waiting = []
            return .probe
        }
        switch step {
        case .answer(let result):
            return result
        case .wait:
            return await withCheckedContinuation { continuation in
                let resumeNow: Result? = self.state.withLock { state in
                    // The probe may have ended between the two locks.
                    guard state.waiting != nil else { return state.last }
                    state.waiting!.append(continuation)
                    return nil
                }
                if let resumeNow { continuation.resume(returning: resumeNow) }
            }
        case .probe:
            let result = (readiness: await self.store.readiness(), at: ContinuousClock.now)
            let waiting = self.state.withLock { state in
                state.last = result
                defer { state.waiting = nil }
                return state.waiting ?? []
            }
            for continuation in waiting { continuation.resume(returning: result) }
            return result
        }
    }
}
