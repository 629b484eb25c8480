import Synchronization

/// Keeps systemd's one-line `STATUS=` current: what the service is doing now. Sends only when the text changes.
public final class StatusBoard: Sendable {
    private struct State {
        var serving: String?
        var database: String?
        var activity: [String: String] = [:]
        var lastSent: String?
    }
    private let state = Mutex(State())
    private let notifier: SystemdNotifier

    public init(notifier: SystemdNotifier) {
        self.notifier = notifier
    }

    /// "serving on 127.0.0.1:8080".
    public func serving(on address: String) {
        self.update { $0.serving = "serving on \(address)" }
    }

    /// A database problem, or nil when it answers again.
    public func database(_ problem: String?) {
        self.update { $0.database = problem.map { "database unavailable: \($0)" } }
    }

    /// What one worker (or the tick) is doing, or nil when idle: "daily Asia/Kathmandu 2025-10-29".
    public func activity(_ key: String, _ text: String?) {
        self.update { $0.activity[key] = text }
    }

    /// The current line.
    public var line: String {
        self.state.withLock { Self.compose($0) }
    }

    private func update(_ change: (inout State) -> Void) {
        let toSend: String? = self.state.withLock { state in
            change(&state)
            let line = Self.compose(state)
            guard line != state.lastSent, state.serving != nil else { return nil }
            state.lastSent = line
            return line
        }
        if let toSend { self.notifier.status(toSend) }
    }

    private static func compose(_ state: State) -> String {
        var parts = [state.serving ?? "starting"]
        if let database = state.database { parts.append(database) }
        let activities = Set(state.activity.values).sorted()
        if activities.isEmpty {
            // Not "idle" while the database fails: due work may be waiting, and the line must not say all is calm.
            parts.append(state.database == nil ? "idle" : "work waiting for the database")
        } else {
            parts.append(activities.joined(separator: ", "))
        }
        let line = parts.joined(separator: "; ")
        return line.count > 200 ? String(line.prefix(199)) + "…" : line
    }
}
