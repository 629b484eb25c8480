import HealthMetrics
import Logging
import MetricsdPostgres
import ServiceLifecycle

extension Scheduler {
    /// With retention on: creates a retention run when one is due (`WorkQueue.enqueueRetention`: an hour after
    /// the last one's cutoff, whichever instance gets there first) and finishes runs whose chunks are all done.
    func retentionTick() async throws {
        let days = self.configuration.retentionDays
        guard days > 0 else { return }
        if let run = try await self.queue.enqueueRetention(days: days) {
            var metadata: Logger.Metadata = [
                "metricsd.retention.run": "\(run.id)", "metricsd.retention.days": "\(days)",
                "metricsd.retention.cutoff": "\(run.cutoff)", "metricsd.retention.full_pass": "\(run.fullPass)",
                "metricsd.chunks": "\(run.chunks)",
            ]
            if let dates = run.dates {
                metadata["metricsd.retention.dates"] = "\(dates.lowerBound)..\(dates.upperBound)"
            }
            // A full pass (the first, then weekly) may take a while on a large table; the hourly ones are routine.
            self.logger.log(level: run.fullPass ? .info : .debug, "Retention run due", metadata: metadata)
            if run.chunks > 0 { self.signal.notify() }
        }
        for run in try await self.queue.finishRetentionRuns() { self.reportRetention(run) }
    }

    /// Works through a retention chunk; hands it back between batches when daily or recompute work is waiting.
    func remove(_ chunk: RetentionChunk) async throws {
        let liveness = self.liveness
        let progress = try await self.queue.process(
            chunk, shouldStop: { Task.isShuttingDownGracefully }, afterBatch: { _ in liveness.beat() })
        self.reporter.recordRemoval(progress)
        switch progress.end {
        case .finished:
            for run in try await self.queue.finishRetentionRuns(after: chunk) { self.reportRetention(run) }
        case .stopped:
            self.logger.info("Chunk handed back on shutdown", metadata: Self.metadata(.retention(chunk)))
        case .yielded:
            self.logger.debug(
                "Retention chunk handed back: daily or recompute work is waiting",
                metadata: Self.metadata(.retention(chunk)))
        case .leaseLost:
            self.logger.warning(
                "Chunk lease lost to another worker; batch rolled back", metadata: Self.metadata(.retention(chunk)))
        }
    }

    func reportRetention(_ run: WorkQueue.FinishedRetentionRun) {
        self.reporter.recordRetentionRun(run)
        self.logger.info(
            "Retention run done: \(run.removed) rows removed",
            metadata: [
                "metricsd.retention.run": "\(run.id)", "metricsd.retention.days": "\(run.days)",
                "metricsd.retention.cutoff": "\(run.cutoff)", "metricsd.retention.rows_removed": "\(run.removed)",
                "metricsd.duration.seconds": "\((run.seconds * 1000).rounded() / 1000)",
            ])
    }
}
