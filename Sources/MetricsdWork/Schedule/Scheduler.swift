import CoreMetrics
import HealthMetrics
import Logging
import MetricsdPostgres
import MetricsdSystemd
import MetricsdTracing
import ServiceLifecycle
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The daily job, recompute and retention workers of one instance.
///
/// - A tick loop asks PostgreSQL, about once a minute, which zones' daily time has passed (the database decides,
///   on its clock and tz rules; see `SQL.zoneScheduleCTE`) and creates their units, and, with retention on, a
///   retention run when one is due. It beats `Liveness` every second; the database work of a tick runs beside it,
///   so a slow database never looks like a hang.
/// - Workers claim chunks (daily first, then recompute, then retention) and work through them batch by batch. On
///   SIGTERM they finish the batch in hand, give the chunk back at once and stop.
public struct Scheduler: Service {
    public struct Configuration: Sendable {
        public var tick: Duration = .seconds(60)
        public var idlePoll: Duration = .seconds(2)
        public var workers: Int = 2
        /// `METRICSD_RETENTION_DAYS`: 0 keeps every row; otherwise this instance creates retention runs and claims
        /// their chunks.
        public var retentionDays: Int = 0
        /// Runs before each turn of the tick loop with the number of ticks so far: a seam for tests, which
        /// inject a hang there (the loop stops beating, as a deadlock would). Nil in the shipped daemon.
        public var beforeTick: (@Sendable (Int) async -> Void)?
        public init() {}
    }

    let queue: WorkQueue
    let dailyAt: ReadMostly<DailyTime>
    let configuration: Configuration
    let liveness: Liveness
    let signal: WorkSignal
    /// Called once the scheduler runs (the daemon's READY waits for it).
    let started: @Sendable () -> Void
    let status: StatusBoard
    let reporter: OperatorMetrics
    let logger: Logger
    /// How far the database's wall clock is ahead of this host's, in seconds, as last measured: the minute ticks are
    /// aligned to the database's minutes, on whose clock units fall due.
    private let databaseClockOffset = ReadMostly<Double>(0)
    /// Whether the first tick has made the lateness histograms of the offsets in use.
    private let latenessRegistered = ReadMostly<Bool>(false)

    package init(
        queue: WorkQueue, dailyAt: ReadMostly<DailyTime>, configuration: Configuration, liveness: Liveness,
        signal: WorkSignal, started: @escaping @Sendable () -> Void, status: StatusBoard, reporter: OperatorMetrics,
        logger: Logger
    ) {
        self.queue = queue
        self.dailyAt = dailyAt
        self.configuration = configuration
        self.liveness = liveness
        self.signal = signal
        self.started = started
        self.status = status
        self.reporter = reporter
        self.logger = logger
    }

    public func run() async throws {
        self.started()
        await withDiscardingTaskGroup { group in
            group.addTask { await self.tickLoop() }
            for worker in 0..<self.configuration.workers {
                group.addTask { await self.workerLoop(worker) }
            }
        }
        self.logger.debug("Scheduler stopped")
    }

    // MARK: Tick

    private func tickLoop() async {
        let tickRunning = AtomicFlag()
        var ticks = 0
        var nextTick = ContinuousClock.now
        var lastTimezoneRefresh: ContinuousClock.Instant?
        await withDiscardingTaskGroup { group in
            while !Task.isShuttingDownGracefully && !Task.isCancelled {
                await self.configuration.beforeTick?(ticks)
                self.liveness.beat()
                let now = ContinuousClock.now
                if now >= nextTick {
                    ticks += 1
                    nextTick = Self.nextTick(
                        after: now, interval: self.configuration.tick,
                        databaseClockOffset: self.databaseClockOffset.value)
                    let refresh = lastTimezoneRefresh.map { now - $0 > .seconds(3600) } ?? true
                    if refresh { lastTimezoneRefresh = now }
                    if tickRunning.set() {
                        group.addTask {
                            await self.tick(refreshTimezones: refresh)
                            tickRunning.clear()
                        }
                    } else {
                        self.logger.warning("Previous scheduler tick still running; skipping this one")
                    }
                }
                let slice = min(Duration.seconds(1), self.configuration.tick)
                // Ended by a stop at once: a plain sleep here held every stop (and so every restart, while clients
                // wait in the socket's backlog) for up to a second.
                let pause = min(slice, max(.milliseconds(10), nextTick - ContinuousClock.now))
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: pause) }
            }
        }
    }

    /// How long after the database's minute an aligned tick starts: every daily time falls on a whole minute of
    /// the database's clock, so the unit starts this soon after it is due. The clock offset is measured at each
    /// tick and is good to a round trip; a tick that still comes early waits in ``tick(refreshTimezones:)``.
    static let alignment = 0.1

    /// Whether ticks of this interval are aligned to the database's minutes: whole minutes (a fraction of a second ignored).
    static func alignsToMinutes(_ interval: Duration) -> Bool {
        interval >= .seconds(60) && interval.components.seconds % 60 == 0
    }

    /// The next tick: every `interval`, aligned to the database clock's minutes (plus ``alignment``) when the
    /// interval is a whole number of minutes, so units start within a fraction of a second of falling due.
    static func nextTick(
        after now: ContinuousClock.Instant, interval: Duration, databaseClockOffset: Double,
        wallClock: Double = Date().timeIntervalSince1970
    ) -> ContinuousClock.Instant {
        guard Self.alignsToMinutes(interval) else { return now + interval }
        let intoMinute = (wallClock + databaseClockOffset).truncatingRemainder(dividingBy: 60)
        var untilAligned = (60 + Self.alignment - intoMinute).truncatingRemainder(dividingBy: 60)
        // A tick that woke a hair before its aligned instant (the sleep runs on the monotonic clock) would otherwise
        // schedule the next one for right now: one tick per minute, not two. An aligned instant less than
        // `alignment` away is skipped only when this tick is already past the minute it stands for.
        if untilAligned < Self.alignment { untilAligned += 60 }
        let base = now + .milliseconds(Int64(untilAligned * 1000))
        return base + interval - .seconds(60)
    }

    /// Before a minute tick's work: measures the database clock, and when the tick came early (the database is
    /// still in the last second of the previous minute: the offset moved since it was measured), waits for the
    /// database's minute, so a unit due at it is not left for the next tick. False: a stop came meanwhile.
    private func alignToDatabaseMinute() async throws -> Bool {
        guard Self.alignsToMinutes(self.configuration.tick) else { return true }
        let clock = try await self.queue.databaseClock()
        self.databaseClockOffset.value = clock.offset
        let intoMinute = clock.now.truncatingRemainder(dividingBy: 60)
        guard intoMinute >= 59 else { return true }
        let wait = Duration.milliseconds(Int64((60 - intoMinute + Self.alignment / 2) * 1000))
        do {
            try await cancelWhenGracefulShutdown { try await Task.sleep(for: wait) }
            return true
        } catch {
            return false
        }
    }

    private func tick(refreshTimezones: Bool) async {
        if refreshTimezones {
            await self.addMonthlyPartitions()
            await self.truncateEmptiedPartitions()
        }
        do {
            if refreshTimezones { try await self.queue.refreshKnownTimezones() }
            guard try await self.alignToDatabaseMinute() else { return }
            let dailyAt = self.dailyAt.value
            if !self.latenessRegistered.value {
                try await self.reporter.registerLateness(dailyAt: dailyAt)
                self.latenessRegistered.value = true
            }
            let units = try await self.queue.enqueueDueUnits(dailyAt: dailyAt)
            for unit in units {
                self.logger.info(
                    "Daily unit due",
                    metadata: [
                        "metricsd.zone": "\(unit.timezone)", "metricsd.date": "\(unit.localDate)",
                        "metricsd.chunks": "\(unit.chunks)",
                    ])
            }
            if !units.isEmpty { self.signal.notify() }
            for finished in try await self.queue.finishCompleted() { self.reportFinished(finished) }
            try await self.retentionTick()
            try await self.reporter.refresh(dailyAt: dailyAt)
            self.status.database(nil)
        } catch {
            self.status.database(Self.shortReason(error))
            self.logger.warning("Scheduler tick failed", metadata: .errorFields(error))
        }
    }

    /// The history's partitions for the months ahead (start-up and hourly). A failure is logged and left to the next
    /// hour: until a month has its partition, its rows go into the default partition, which takes any date.
    private func addMonthlyPartitions() async {
        do {
            let created = try await self.queue.addMonthlyPartitions()
            if created > 0 {
                self.logger.info(
                    "Added monthly partitions of profile_metrics", metadata: ["metricsd.partitions": "\(created)"])
            }
        } catch {
            self.logger.warning(
                "Could not add the monthly partitions of profile_metrics", metadata: .errorFields(error))
        }
    }

    /// With retention on (start-up and hourly): gives back the space of the months retention has emptied. A
    /// failure is logged and left to the next hour.
    private func truncateEmptiedPartitions() async {
        let days = self.configuration.retentionDays
        guard days > 0 else { return }
        do {
            let truncated = try await self.queue.truncateEmptiedPartitions(retentionDays: days)
            if truncated > 0 {
                self.logger.info(
                    "Truncated the monthly partitions of profile_metrics that retention emptied",
                    metadata: ["metricsd.partitions": "\(truncated)"])
            }
        } catch {
            self.logger.warning(
                "Could not truncate the emptied monthly partitions of profile_metrics", metadata: .errorFields(error))
        }
    }

    // MARK: Workers

    private func workerLoop(_ worker: Int) async {
        let key = "worker\(worker)"
        var failures = 0
        // A chunk whose failure could not be recorded (the database was unreachable): it stays leased to this
        // instance, untouched, for the rest of its lease unless the failure is recorded once the database is back.
        var unrecorded: (work: ClaimedWork, error: String)?
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            var claimed: ClaimedWork?
            do {
                if let failed = unrecorded {
                    try await self.queue.fail(failed.work, error: failed.error)
                    unrecorded = nil
                }
                guard let work = try await self.claim() else {
                    self.status.activity(key, nil)
                    failures = 0
                    await cancelWhenGracefulShutdown { await self.signal.wait(timeout: self.configuration.idlePoll) }
                    continue
                }
                claimed = work
                if let previous = work.takenOverFrom {
                    self.reporter.recordTakeover(work)
                    var metadata = Self.metadata(work)
                    metadata["metricsd.lease.previous_owner"] = "\(previous)"
                    self.logger.warning("Took over a chunk whose lease another instance let expire", metadata: metadata)
                }
                self.status.activity(key, Self.describe(work))
                switch work {
                case .users(let chunk): try await self.compute(chunk)
                case .retention(let chunk): try await self.remove(chunk)
                }
                failures = 0
                self.status.database(nil)
            } catch {
                failures += 1
                self.reporter.recordFailure(claimed)
                self.status.database(Self.shortReason(error))
                var metadata = claimed.map(Self.metadata) ?? [:]
                metadata.merge(.errorFields(error)) { $1 }
                self.logger.warning("Worker failed; retrying", metadata: metadata)
                if let work = claimed {
                    let message = "\(error)"
                    do {
                        try await self.queue.fail(work, error: message)
                    } catch {
                        unrecorded = (work, message)
                    }
                }
                let backoff = Duration.milliseconds(min(30_000, 250 << min(failures, 7)))
                await cancelWhenGracefulShutdown { try? await Task.sleep(for: backoff) }
            }
            self.status.activity(key, nil)
        }
    }

    /// Claims the next chunk: retention chunks too when this instance has retention on.
    private func claim() async throws -> ClaimedWork? {
        if self.configuration.retentionDays > 0 { return try await self.queue.claimWork() }
        return try await self.queue.claim().map(ClaimedWork.users)
    }

    /// Works through a chunk of a daily unit or a recompute job: traced, in a span of its own (a root: no request
    /// asked for it), whose children are the chunk's statements and connection waits.
    private func compute(_ chunk: ClaimedChunk) async throws {
        try await Traces.withSpan(chunk.spanName, attributes: chunk.spanAttributes) { _ in
            try await self.computeUntraced(chunk)
        }
    }

    private func computeUntraced(_ chunk: ClaimedChunk) async throws {
        let started = ContinuousClock.now
        let liveness = self.liveness
        let reporter = self.reporter
        let clockOffset = self.databaseClockOffset.value
        let writtenSoFar = Mutex(0)
        let progress = try await self.queue.process(
            chunk, shouldStop: { Task.isShuttingDownGracefully },
            afterBatch: { progress in
                liveness.beat()
                guard let due = chunk.dueEpochSeconds else { return }
                let written = writtenSoFar.withLock { previous in
                    defer { previous = progress.written }
                    return progress.written - previous
                }
                reporter.recordLateness(chunk, written: written, lateness: Self.epochSeconds() + clockOffset - due)
            })
        self.reporter.recordChunk(chunk, progress: progress, duration: ContinuousClock.now - started)
        switch progress.end {
        case .finished:
            for finished in try await self.queue.finishCompleted(after: chunk) { self.reportFinished(finished) }
        case .stopped:
            self.logger.info("Chunk handed back on shutdown", metadata: Self.metadata(.users(chunk)))
        case .leaseLost:
            self.logger.warning(
                "Chunk lease lost to another worker, or its work was cancelled; batch rolled back",
                metadata: Self.metadata(.users(chunk)))
        }
    }

    private func reportFinished(_ finished: WorkQueue.Finished) {
        self.reporter.recordFinished(finished)
        switch finished {
        case .unit(let zone, let date, let version, let counts, let seconds, let delay):
            var metadata = Self.metadata(counts)
            metadata["metricsd.zone"] = "\(zone)"
            metadata["metricsd.date"] = "\(date)"
            metadata["metricsd.version"] = "\(version)"
            metadata["metricsd.duration.seconds"] = "\((seconds * 1000).rounded() / 1000)"
            metadata["metricsd.delay.seconds"] = "\((delay * 1000).rounded() / 1000)"
            self.logger.info("Daily unit done: \(counts.summary)", metadata: metadata)
        case .job(let id, let counts, let seconds):
            var metadata = Self.metadata(counts)
            metadata["metricsd.job.id"] = "\(id)"
            metadata["metricsd.duration.seconds"] = "\((seconds * 1000).rounded() / 1000)"
            self.logger.info("Recompute job \(id) done: \(counts.summary)", metadata: metadata)
        }
    }

    /// This host's wall clock, in seconds since the epoch.
    static func epochSeconds() -> Double {
        Date().timeIntervalSince1970
    }

    static func metadata(_ counts: WorkCounts) -> Logger.Metadata {
        [
            "metricsd.users.total": "\(counts.total)", "metricsd.users.examined": "\(counts.examined)",
            "metricsd.users.written": "\(counts.written)", "metricsd.users.already_current": "\(counts.alreadyCurrent)",
            "metricsd.users.skipped": "\(counts.skipped)",
        ]
    }

    static func describe(_ work: ClaimedWork) -> String {
        switch work {
        case .users(let chunk):
            switch chunk.kind {
            case .daily(let zone, let date): "daily \(zone) \(date)"
            case .recompute(let job): "recompute job \(job)"
            }
        case .retention(let chunk): "retention run \(chunk.runID) \(chunk.date)"
        }
    }

    static func metadata(_ work: ClaimedWork) -> Logger.Metadata {
        var metadata: Logger.Metadata = ["metricsd.chunk.id": "\(work.id)"]
        switch work {
        case .users(let chunk):
            switch chunk.kind {
            case .daily(let zone, let date):
                metadata["metricsd.zone"] = "\(zone)"
                metadata["metricsd.date"] = "\(date)"
            case .recompute(let job):
                metadata["metricsd.job.id"] = "\(job)"
            }
        case .retention(let chunk):
            metadata["metricsd.retention.run"] = "\(chunk.runID)"
            metadata["metricsd.date"] = "\(chunk.date)"
        }
        return metadata
    }

    static func shortReason(_ error: any Error) -> String {
        let text = "\(error)"
        return text.count > 80 ? String(text.prefix(79)) + "…" : text
    }
}
