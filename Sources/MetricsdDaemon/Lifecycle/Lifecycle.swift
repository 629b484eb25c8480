import Logging
import MetricsdSystemd
import ServiceLifecycle

/// Start-up and shutdown state shared with the signal watcher.
package actor Lifecycle {
    package init() {}

    private enum State {
        case starting(Task<Void, any Error>?)
        case running(ServiceGroup, reload: @Sendable () async -> Void)
        case stopping
    }
    private var state: State = .starting(nil)
    private var stopRequested = false

    /// Runs start-up work that a stop signal cancels.
    package func startup(_ work: @escaping @Sendable () async throws -> Void) async throws {
        let task = Task { try await work() }
        self.state = .starting(task)
        if self.stopRequested { task.cancel() }
        try await task.value
    }

    /// Runs the service group until it stops; a stop signal shuts it down gracefully (bounded by the group's
    /// maximum graceful shutdown duration).
    package func running(group: ServiceGroup, reload: @escaping @Sendable () async -> Void) async throws {
        if self.stopRequested { throw CancellationError() }
        self.state = .running(group, reload: reload)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await tasks.next()
            tasks.cancelAll()
        }
    }

    package func stop() async {
        self.stopRequested = true
        switch self.state {
        case .starting(let task): task?.cancel()
        case .running(let group, _):
            self.state = .stopping
            await group.triggerGracefulShutdown()
        case .stopping: break
        }
    }

    package func reload(notifier: SystemdNotifier, logger: Logger) async {
        notifier.reloading()
        guard case .running(_, let reload) = self.state else {
            notifier.ready(status: "reload ignored: still starting")
            return
        }
        await reload()
    }
}
