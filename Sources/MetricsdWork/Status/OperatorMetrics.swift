import CoreMetrics
import HealthMetrics
import MetricsdPostgres

/// The daily-job and recompute series of `/metrics` (help text and buckets: `MetricCatalog`).
package final class OperatorMetrics: Sendable {
    private let status: StatusQueries
    private let jobs: RecomputeJobs
    private let version: Int
    private let oldestOverdue = Gauge(label: "metricsd_daily_oldest_overdue_unit_age_seconds")
    private let usersWaiting = Gauge(label: "metricsd_daily_users_waiting")
    private let unitsDone = Gauge(label: "metricsd_daily_units", dimensions: [("state", "done")])
    private let unitsRunning = Gauge(label: "metricsd_daily_units", dimensions: [("state", "running")])
    private let unitsPending = Gauge(label: "metricsd_daily_units", dimensions: [("state", "pending")])
    private let unitsMissing = Gauge(label: "metricsd_daily_units", dimensions: [("state", "missing")])
    private let unitsCompleted = Counter(label: "metricsd_daily_units_completed_total")
    private let unitDuration = Timer(label: "metricsd_daily_unit_duration_seconds")
    private let unitDelay = Timer(label: "metricsd_daily_unit_delay_seconds")
    private let chunksLost = Counter(label: "metricsd_work_chunks_lost_total")
    private let recomputeExamined = Gauge(label: "metricsd_recompute_users", dimensions: [("state", "examined")])
    private let recomputeTotal = Gauge(label: "metricsd_recompute_users", dimensions: [("state", "total")])
    private let recomputeActive = Gauge(label: "metricsd_recompute_jobs_active")
    private let work: [String: WorkSeries]
    private let retentionDays: Int
    private let retentionRemoved = Counter(label: "metricsd_retention_rows_removed_total")
    private let retentionRuns = Counter(label: "metricsd_retention_runs_completed_total")
    private let retentionTakenOver = Counter(
        label: "metricsd_work_leases_taken_over_total", dimensions: [("kind", "retention")])
    /// Only while retention is on: a 0 would read as "caught up".
    private let retentionBehind: Gauge?
    private let historyMoveActive = Gauge(label: "metricsd_history_move_active")
    private let historyMoveEstimated = Gauge(label: "metricsd_history_move_rows", dimensions: [("state", "estimated")])
    private let historyMoveCopied = Gauge(label: "metricsd_history_move_rows", dimensions: [("state", "copied")])
    private let historyMovePending = Gauge(label: "metricsd_history_move_writes_pending")

    /// The per-kind counters of the work vocabulary: examined = written + already current + skipped.
    private struct WorkSeries: Sendable {
        let examined: Counter
        let written: Counter
        let alreadyCurrent: Counter
        let skipped: Counter
        let takenOver: Counter

        init(kind: String) {
            self.examined = Counter(label: "metricsd_users_examined_total", dimensions: [("kind", kind)])
            self.written = Counter(label: "metricsd_users_written_total", dimensions: [("kind", kind)])
            self.alreadyCurrent = Counter(label: "metricsd_users_already_current_total", dimensions: [("kind", kind)])
            self.skipped = Counter(label: "metricsd_users_skipped_total", dimensions: [("kind", kind)])
            self.takenOver = Counter(label: "metricsd_work_leases_taken_over_total", dimensions: [("kind", kind)])
        }
    }

    package init(status: StatusQueries, jobs: RecomputeJobs, version: Int, retentionDays: Int = 0) {
        self.status = status
        self.jobs = jobs
        self.version = version
        self.retentionDays = retentionDays
        self.retentionBehind = retentionDays > 0 ? Gauge(label: "metricsd_retention_behind_seconds") : nil
        // Made at start-up, so every family is on /metrics (at 0) before the first unit or job.
        self.work = ["daily": WorkSeries(kind: "daily"), "recompute": WorkSeries(kind: "recompute")]
    }

    /// Refreshes the gauges read from the database (every scheduler tick).
    func refresh(dailyAt: DailyTime) async throws {
        let overview = try await self.status.overview(dailyAt: dailyAt, version: self.version)
        self.oldestOverdue.record(overview.oldestOverdueSeconds)
        self.usersWaiting.record(overview.usersWaiting)
        self.registerLateness(overview.utcOffsets)
        self.unitsDone.record(overview.unitsDone)
        self.unitsRunning.record(overview.unitsRunning)
        self.unitsPending.record(overview.unitsPending)
        self.unitsMissing.record(overview.unitsMissing)
        let active = try await self.jobs.active()
        self.recomputeActive.record(active.count)
        self.recomputeExamined.record(active.reduce(0) { $0 + $1.usersExamined })
        self.recomputeTotal.record(active.reduce(0) { $0 + $1.usersTotal })
        if let behind = self.retentionBehind {
            behind.record(try await self.status.retention(days: self.retentionDays).behindSeconds)
        }
        let move = try await self.status.historyMove()
        self.historyMoveActive.record(move.map { $0.state == .done ? 0 : 1 } ?? 0)
        self.historyMoveEstimated.record(move?.rowsEstimate ?? 0)
        self.historyMoveCopied.record(move?.rowsCopied ?? 0)
        self.historyMovePending.record(move?.logEntries ?? 0)
    }

    private static func kind(_ chunk: ClaimedChunk) -> String {
        switch chunk.kind {
        case .daily: "daily"
        case .recompute: "recompute"
        }
    }

    private static func kind(_ work: ClaimedWork) -> String {
        switch work {
        case .users(let chunk): Self.kind(chunk)
        case .retention: "retention"
        }
    }

    /// A claim of a chunk whose lease another instance held and let expire.
    func recordTakeover(_ work: ClaimedWork) {
        switch work {
        case .users(let chunk): self.work[Self.kind(chunk)]?.takenOver.increment()
        case .retention: self.retentionTakenOver.increment()
        }
    }

    /// What a retention chunk removed.
    func recordRemoval(_ progress: WorkQueue.RetentionProgress) {
        self.retentionRemoved.increment(by: progress.removed)
        if progress.end == .leaseLost { self.chunksLost.increment() }
    }

    func recordRetentionRun(_ run: WorkQueue.FinishedRetentionRun) {
        self.retentionRuns.increment()
    }

    func recordChunk(_ chunk: ClaimedChunk, progress: WorkQueue.ChunkProgress, duration: Duration) {
        let kind = Self.kind(chunk)
        if let series = self.work[kind] {
            series.examined.increment(by: progress.examined)
            series.written.increment(by: progress.written)
            series.alreadyCurrent.increment(by: progress.alreadyCurrent)
            series.skipped.increment(by: progress.skipped)
        }
        for (code, count) in progress.skipCounts {
            Counter(label: "metricsd_skip_reasons_total", dimensions: [("kind", kind), ("reason", code.rawValue)])
                .increment(by: count)
        }
        if progress.end == .leaseLost { self.chunksLost.increment() }
    }

    /// A worker failed on a chunk (database error, lost connection …); the chunk is retried after a backoff.
    func recordFailure(_ work: ClaimedWork?) {
        let kind = work.map(Self.kind) ?? "claim"
        Counter(label: "metricsd_work_failures_total", dimensions: [("kind", kind)]).increment()
    }

    /// The lateness of the rows a daily chunk's batch just committed: `written` rows, committed `lateness`
    /// seconds after their due instant, labelled by the zone's UTC offset (a bounded label: about 40 offsets
    /// exist). One observation per row, so the histogram counts users, not batches.
    func recordLateness(_ chunk: ClaimedChunk, written: Int, lateness: Double) {
        guard written > 0, case .daily = chunk.kind else { return }
        let offset = chunk.utcOffsetSeconds.map(Self.utcOffsetLabel) ?? "unknown"
        let timer = Timer(label: "metricsd_daily_lateness_seconds", dimensions: [("utc_offset", offset)])
        let nanoseconds = Int64(max(0, lateness) * 1e9)
        for _ in 0..<written { timer.recordNanoseconds(nanoseconds) }
    }

    /// Makes the lateness histogram of each offset exist before its first row: a series that appears with its
    /// first observations already counted shows no increase over any range.
    func registerLateness(_ utcOffsets: [Int]) {
        for offset in utcOffsets {
            _ = Timer(
                label: "metricsd_daily_lateness_seconds", dimensions: [("utc_offset", Self.utcOffsetLabel(offset))])
        }
    }

    /// Registers the lateness histograms of the offsets in use (the first tick does it before any unit is created:
    /// the refresh after the work comes too late for the first units).
    func registerLateness(dailyAt: DailyTime) async throws {
        self.registerLateness(try await self.status.overview(dailyAt: dailyAt, version: self.version).utcOffsets)
    }

    /// `+05:45`, `-03:30`, `+00:00`.
    static func utcOffsetLabel(_ seconds: Int) -> String {
        let minutes = abs(seconds) / 60
        let hours = minutes / 60
        let rest = minutes % 60
        return (seconds < 0 ? "-" : "+") + (hours < 10 ? "0" : "") + "\(hours):" + (rest < 10 ? "0" : "") + "\(rest)"
    }

    func recordFinished(_ finished: WorkQueue.Finished) {
        if case .unit(_, _, _, _, let seconds, let delay) = finished {
            self.unitsCompleted.increment()
            self.unitDuration.recordNanoseconds(Int64(max(0, seconds) * 1e9))
            self.unitDelay.recordNanoseconds(Int64(max(0, delay) * 1e9))
        }
    }
}

extension WorkCounts {
    /// The counts in the words every report uses: the CLI, the admin API, the log and `/metrics`.
    package var summary: String {
        "\(self.examined) users examined, \(self.written) written, \(self.alreadyCurrent) already current, "
            + "\(self.skipped) skipped"
    }
}
