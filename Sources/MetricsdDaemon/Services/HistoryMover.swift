import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdWork
import ServiceLifecycle

/// Moves the history an upgrade left in the old partition of `profile_metrics` into monthly partitions, in the
/// background, one step at a time (`WorkQueue.moveHistory`; migration 0019 says how), until it is done; then it
/// returns. Every instance runs one; the steps' advisory locks let one of them work at a time, and a crashed or
/// stopped instance's last step is rolled back and taken again from the move's cursor by whichever comes next.
///
/// Each copy batch is one transaction; the mover then pauses as long as the batch took (so it takes at most half of
/// one server process's time), and steps aside while daily or recompute work is waiting.
package struct HistoryMover: Service {
    package struct Configuration: Sendable {
        /// Rows per copy batch (one transaction).
        package var batchRows = 10_000
        /// The pause after a copy batch, as a multiple of the batch's duration.
        package var pause = 1.0
        /// How long to wait when another instance holds the move's lock, or daily work is waiting.
        package var busyPause: Duration = .seconds(2)
        package init() {}
    }

    let queue: WorkQueue
    let configuration: Configuration
    let logger: Logger

    package init(queue: WorkQueue, configuration: Configuration = .init(), logger: Logger) {
        self.queue = queue
        self.configuration = configuration
        self.logger = logger
    }

    package func run() async throws {
        var failures = 0
        var announced = false
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            let started = ContinuousClock.now
            let pause: Duration
            do {
                if try await self.queue.higherPriorityWorkWaiting() {
                    await self.sleep(self.configuration.busyPause)
                    continue
                }
                let step = try await self.step()
                failures = 0
                if step == .idle { return }
                if !announced {
                    announced = true
                    self.logger.info("Moving the old partition's history into monthly partitions")
                }
                if step == .finished {
                    self.logger.info("History moved into monthly partitions; the old partition is dropped")
                    return
                }
                self.report(step)
                switch step {
                case .busy: pause = self.configuration.busyPause
                case .copied: pause = (ContinuousClock.now - started) * self.configuration.pause
                default: pause = .zero
                }
            } catch {
                if Task.isShuttingDownGracefully { return }  // the step in hand was interrupted
                failures += 1
                self.logger.warning("History move step failed; retrying", metadata: .errorFields(error))
                pause = .milliseconds(min(60_000, 500 << min(failures, 7)))
            }
            await self.sleep(pause)
        }
    }

    /// The next step of the move; a graceful stop interrupts a long one (a month's index build), so that a stop
    /// never waits for it.
    private func step() async throws -> WorkQueue.HistoryMoveStep {
        let interrupt = WorkQueue.HistoryMoveInterrupt()
        let (queue, batchRows) = (self.queue, self.configuration.batchRows)
        return try await withThrowingTaskGroup(of: WorkQueue.HistoryMoveStep?.self) { group in
            group.addTask { try await queue.moveHistory(batchRows: batchRows, interrupt: interrupt) }
            group.addTask {
                try await gracefulShutdown()
                try await queue.pool.runBlocking { interrupt.interrupt() }
                return nil
            }
            defer { group.cancelAll() }
            while let result = try await group.next() {
                if let step = result { return step }
            }
            throw CancellationError()
        }
    }

    private func report(_ step: WorkQueue.HistoryMoveStep) {
        switch step {
        case .copied(let partition?, _, _, true, let left):
            self.logger.info(
                "History move: a month copied",
                metadata: ["metricsd.partition": "\(partition)", "metricsd.history_move.months_left": "\(left)"])
        case .indexed(let partition):
            self.logger.info("History move: a month's indexes built", metadata: ["metricsd.partition": "\(partition)"])
        case .swapped:
            self.logger.info("History move: the months are attached in place of the old partition")
        default:
            break
        }
    }

    private func sleep(_ duration: Duration) async {
        guard duration > .zero else { return }
        try? await cancelWhenGracefulShutdown { try await Task.sleep(for: duration) }
    }
}
