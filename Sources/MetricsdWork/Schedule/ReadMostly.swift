import Synchronization

/// A value read on every request and replaced rarely (on reload).
package final class ReadMostly<Value: Sendable>: Sendable {
    private let storage: Mutex<Value>

    package init(_ value: Value) {
        self.storage = Mutex(value)
    }

    package var value: Value {
        get { self.storage.withLock { $0 } }
        set { self.storage.withLock { $0 = newValue } }
    }
}
