/// A connection's own task, for the work of its requests that does not belong on the event loop: async
/// handlers (database writes, admin operations), the rest of a callback handler that needs one (a just-onboarded
/// user's metrics, computed on request), and slow token checks. ``HTTPServer`` gives every connection a task
/// (``HTTPChannelSetup/handle(_:)``), which runs ``run()``: jobs run one at a time, in order, and
/// are cancelled with that task when the server is torn down.
///
/// At most one job is queued or running per connection: NIO's pipeline handler lets the next request in only
/// after the reply to the current one has ended.
package final class ConnectionWorker: Sendable {
    typealias Job = @Sendable () async -> Void

    private let jobs: AsyncStream<Job>
    private let continuation: AsyncStream<Job>.Continuation

    init() {
        (self.jobs, self.continuation) = AsyncStream.makeStream(of: Job.self)
    }

    /// Queues a job; false when the connection is gone (the job will never run).
    func submit(_ job: @escaping Job) -> Bool {
        if case .enqueued = self.continuation.yield(job) { return true }
        return false
    }

    /// No more jobs: ``run()`` returns once the queued one has run (the connection closed).
    func finish() {
        self.continuation.finish()
    }

    /// Runs the jobs until the connection closes, or until the task is cancelled (the server's shutdown grace
    /// period is over: a queued job is then dropped, and the job running sees the cancellation).
    func run() async {
        for await job in self.jobs {
            await job()
        }
    }
}
