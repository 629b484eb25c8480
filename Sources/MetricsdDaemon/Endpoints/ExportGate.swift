import HTTPTypes
import MetricsdHTTP
import Synchronization

/// How many exports run at once: one per user, and a few in all. An export reads a user's whole history and
/// holds a connection's task (and a pooled database connection per page) while it streams; without a bound, one
/// client asking again and again, or many at once, would take the pool from the latest read.
final class ExportGate: Sendable {
    /// Exports streaming at once, all users together.
    static let maxConcurrent = 4

    private struct State {
        var users: Set<Int64> = []
    }

    private let state = Mutex(State())
    private let maximum: Int

    init(maximum: Int = ExportGate.maxConcurrent) {
        self.maximum = maximum
    }

    /// A slot for `userID`'s export, given back when the ticket goes (the body written, or never to be).
    func enter(userID: Int64) throws(AppError) -> Ticket {
        let outcome: Int = self.state.withLock { state in
            if state.users.contains(userID) { return 1 }
            if state.users.count >= self.maximum { return 2 }
            state.users.insert(userID)
            return 0
        }
        switch outcome {
        case 1:
            var error = AppError(
                .tooManyRequests, .exportInProgress,
                "an export of your metrics is already being sent; wait for it to finish")
            error.headers[.retryAfter] = "5"
            throw error
        case 2:
            throw AppError.unavailable(.busy, "server busy with other exports, retry shortly")
        default:
            return Ticket(gate: self, userID: userID)
        }
    }

    fileprivate func leave(_ userID: Int64) {
        _ = self.state.withLock { $0.users.remove(userID) }
    }

    /// Holds a slot until it is released: by the stream when it ends, or when the reply is dropped unsent (a HEAD
    /// request, a connection closed before the body began).
    final class Ticket: Sendable {
        private let gate: ExportGate
        private let userID: Int64

        fileprivate init(gate: ExportGate, userID: Int64) {
            self.gate = gate
            self.userID = userID
        }

        deinit {
            self.gate.leave(self.userID)
        }
    }
}
