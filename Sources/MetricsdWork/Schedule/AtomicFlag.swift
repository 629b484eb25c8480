import MetricsdPostgres
import Synchronization

/// A flag set by one task and cleared by another.
final class AtomicFlag: Sendable {
    private let value = Atomic<Bool>(false)

    /// Sets the flag; false when it was set already.
    func set() -> Bool {
        self.value.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    func clear() {
        self.value.store(false, ordering: .releasing)
    }
}
