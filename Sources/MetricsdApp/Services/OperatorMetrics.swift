import CoreMetrics
import HealthMetrics
import MetricsdPostgres

/// The daily-job and recompute series of `/metrics` (README, "Operating metricsd").
final class OperatorMetrics: Sendable {
    private let status: StatusQueries
    private let jobs: RecomputeJobs
    private let version: Int
    private let oldestOverdue = Gauge(label: "metricsd_daily_oldest_overdue_unit_age_seconds")
    private let unitsDone = Gauge(label: "metricsd_daily_units", dimensions: [("state", "done")])
    private let unitsRunning = Gauge(label: "metricsd_daily_units", dimensions: [("state", "running")])
    private let unitsPending = Gauge(label: "metricsd_daily_units", dimensions: [("state", "pending")])
    private let unitsMissing = Gauge(label: "metricsd_daily_units", dimensions: [("state", "missing")])
    private let unitsCompleted = Counter(label: "metricsd_daily_units_completed_total")
    private let unitDuration = Timer(label: "metricsd_daily_unit_duration_seconds")
    private let chunksFailed = Counter(label: "metricsd_work_chunks_lost_total")
    private let recomputeDone = Gauge(label: "metricsd_recompute_users", dimensions: [("state", "done")])
    private let recomputeTotal = Gauge(label: "metricsd_recompute_users", dimensions: [("state", "total")])
    private let recomputeActive = Gauge(label: "metricsd_recompute_jobs_active")

    init(status: StatusQueries, jobs: RecomputeJobs, version: Int) {
        self.status = status
        self.jobs = jobs
        self.version = version
        Gauge(label: "metricsd_build_info", dimensions: [("version", BuildInfo.version), ("formula_version", String(version))])
            .record(1)
    }

    /// Refreshes the gauges read from the database (every scheduler tick).
    func refresh(dailyAt: DailyTime) async throws {
        let overview = try await self.status.overview(dailyAt: dailyAt, version: self.version)
        self.oldestOverdue.record(overview.oldestOverdueSeconds)
        self.unitsDone.record(overview.unitsDone)
        self.unitsRunning.record(overview.unitsRunning)
        self.unitsPending.record(overview.unitsPending)
        self.unitsMissing.record(overview.unitsMissing)
        let active = try await self.jobs.active()
        self.recomputeActive.record(active.count)
        self.recomputeDone.record(active.reduce(0) { $0 + $1.usersDone + $1.usersSkipped })
        self.recomputeTotal.record(active.reduce(0) { $0 + $1.usersTotal })
    }

    func recordChunk(_ chunk: ClaimedChunk, progress: WorkQueue.ChunkProgress, duration: Duration) {
        let kind: String
        switch chunk.kind {
        case .daily: kind = "daily"
        case .recompute: kind = "recompute"
        }
        Counter(label: "metricsd_users_computed_total", dimensions: [("kind", kind)]).increment(by: progress.computed)
        Counter(label: "metricsd_rows_written_total", dimensions: [("kind", kind)]).increment(by: progress.written)
        for (code, count) in progress.skipCounts {
            Counter(label: "metricsd_users_skipped_total", dimensions: [("kind", kind), ("reason", code.rawValue)])
                .increment(by: count)
        }
        if progress.end == .leaseLost { self.chunksFailed.increment() }
    }

    /// A worker failed on a chunk (database error, lost connection …); the chunk is retried after a backoff.
    func recordFailure(_ chunk: ClaimedChunk?) {
        let kind: String
        switch chunk?.kind {
        case .daily?: kind = "daily"
        case .recompute?: kind = "recompute"
        case nil: kind = "claim"
        }
        Counter(label: "metricsd_work_failures_total", dimensions: [("kind", kind)]).increment()
    }

    func recordFinished(_ finished: WorkQueue.Finished) {
        if case .unit(_, _, _, _, _, _, let seconds) = finished {
            self.unitsCompleted.increment()
            self.unitDuration.recordNanoseconds(Int64(seconds * 1e9))
        }
    }
}

/// This build.
public enum BuildInfo {
    /// The version printed by `metricsd --version` and recorded in instance heartbeats.
    public static let version = "1.0.0"
}
