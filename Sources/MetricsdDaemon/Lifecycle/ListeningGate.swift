import ServiceLifecycle
import Synchronization

/// Opens once the main HTTP listener is bound.
package final class ListeningGate: Sendable {
    private let isOpen = Atomic<Bool>(false)

    package init() {}

    package func open() { self.isOpen.store(true, ordering: .releasing) }

    /// True once open; false if the task is cancelled or the group shuts down first (the bind failed).
    func wait() async -> Bool {
        while !self.isOpen.load(ordering: .acquiring) {
            if Task.isCancelled || Task.isShuttingDownGracefully { return false }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return true
    }
}

/// Runs `service` only after the listener is bound, or not at all when the group stops first.
package struct AfterListening: Service {
    let listening: ListeningGate
    let service: any Service

    package init(_ listening: ListeningGate, _ service: any Service) {
        self.listening = listening
        self.service = service
    }

    package func run() async throws {
        guard await self.listening.wait() else { return }
        try await self.service.run()
    }
}

