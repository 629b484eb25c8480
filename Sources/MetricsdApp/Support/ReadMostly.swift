import Synchronization

/// A value read on every request and replaced rarely (on reload).
final class ReadMostly<Value: Sendable>: Sendable {
    private let storage: Mutex<Value>

    init(_ value: Value) {
        self.storage = Mutex(value)
    }

    var value: Value {
        get { self.storage.withLock { $0 } }
        set { self.storage.withLock { $0 = newValue } }
    }
}

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
