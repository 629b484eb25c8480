import HealthMetrics
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdReads
import MetricsdWork

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `metricsd status`: everything an operator asks at 00:30, from the database alone.
struct StatusReport {
    let now: Timestamp
    let dailyAt: DailyTime
    let formulaVersion: Int
    let schema: SchemaStatus
    let migrationsKnown: Int
    let instances: [StatusQueries.InstanceStatus]
    let zones: [StatusQueries.ZoneStatus]
    let skips: [(reason: String, users: Int)]
    let jobs: [RecomputeJob]
    let versions: [(version: Int?, users: Int)]
    /// METRICSD_RETENTION_DAYS (0: off) and where retention stands.
    let retentionDays: Int
    let retention: RetentionStatus
    /// The live instances' read servers (`METRICSD_READ_DATABASE_URL`), as their last heartbeats say.
    let readServers: [StatusQueries.ReadServerStatus]
    /// The move of an upgraded install's history into monthly partitions (nil: there was none), and whether this
    /// configuration takes part in it (`METRICSD_HISTORY_MOVE`).
    let historyMove: HistoryMoveStatus?
    let historyMoveOn: Bool

    static func gather(
        pool: PostgresPool, dailyAt: DailyTime, formula: MetricsFormula, retentionDays: Int, historyMoveOn: Bool = true
    ) async throws -> StatusReport {
        let queries = StatusQueries(pool: pool)
        let migrator = Migrator()
        let schema = try await pool.withConnection { try migrator.status(on: $0) }
        guard schema.latestApplied != nil else {
            throw OperatorSession.Failure(
                "the database has no metricsd schema yet: run `metricsd migrate`",
                code: OperatorSession.Failure.schemaMissing)
        }
        let now = try await pool.withConnection { connection in
            Timestamp(
                millisecondsSinceEpoch: try connection.query("SELECT (extract(epoch FROM now()) * 1000)::bigint").int(
                    0, 0))
        }
        return StatusReport(
            now: now, dailyAt: dailyAt, formulaVersion: formula.version, schema: schema,
            migrationsKnown: migrator.migrations.count, instances: try await queries.instances(),
            zones: try await queries.zones(dailyAt: dailyAt, version: formula.version),
            skips: try await queries.skipsByReason(), jobs: try await RecomputeJobs(pool: pool).recent(limit: 5),
            versions: try await queries.usersByLatestVersion(), retentionDays: retentionDays,
            retention: try await queries.retention(days: max(1, retentionDays)),
            readServers: try await queries.readServers(),
            historyMove: try await queries.historyMove(), historyMoveOn: historyMoveOn)
    }

    private func count(_ state: StatusQueries.ZoneStatus.State) -> Int {
        self.zones.filter { $0.state == state }.count
    }

    var text: String {
        var lines: [String] = []
        let schemaLine =
            self.schema.isCurrent
            ? "current (\(self.schema.latestApplied ?? "-"))"
            : "BEHIND: \(self.schema.pending.count) pending (\(self.schema.pending.joined(separator: ", ")))"
        lines.append(
            "metricsd status at \(self.now)   formula version \(self.formulaVersion)   daily at \(self.dailyAt)")
        lines.append("schema: \(schemaLine)")
        lines.append("")
        let alive = self.instances.filter(\.alive).count
        lines.append("instances: \(alive) alive")
        if !self.instances.isEmpty {
            lines.append(
                TextTable.render(
                    header: ["INSTANCE", "VERSION", "FORMULA", "LISTEN", "STARTED", "LAST SEEN", "STATE"],
                    rows: self.instances.map { instance in
                        [
                            instance.id, instance.buildVersion, String(instance.formulaVersion), instance.listen,
                            instance.startedAt.iso8601, instance.lastSeenAt.iso8601,
                            instance.alive ? "alive" : (instance.stoppedAt != nil ? "stopped" : "silent"),
                        ]
                    }))
        }
        lines.append("")
        lines.append(contentsOf: self.readServerLines)
        lines.append("")
        lines.append(
            "daily units (\(self.zones.count) zones): done \(self.count(.done)), running \(self.count(.running)), pending \(self.count(.pending) + self.count(.missing)), overdue \(self.count(.overdue))"
        )
        let late = self.zones.compactMap { zone in zone.finishedLateSeconds.map { (zone, $0) } }
            .sorted { $0.1 > $1.1 }.prefix(5)
        if !late.isEmpty {
            lines.append(
                "  latest done after their due instant: "
                    + late.map { "\($0.0.timezone) \(OperatorSession.duration($0.1))" }.joined(separator: ", "))
        }
        let notDone = self.zones.filter { $0.state != .done }
        if !notDone.isEmpty {
            lines.append(
                TextTable.render(
                    header: ["ZONE", "DATE", "DUE AT", "STATE", "USERS", "DONE", "SKIPPED", "RUNNING BY"],
                    rows: notDone.map { zone in
                        [
                            zone.timezone + (zone.known ? "" : " (unknown zone)"), zone.dueDate.description,
                            zone.dueAt.iso8601,
                            zone.state == .overdue
                                ? "OVERDUE \(OperatorSession.duration(zone.overdueSeconds))" : zone.state.rawValue,
                            String(zone.usersTotal), String(zone.usersDone), String(zone.usersSkipped),
                            zone.runningBy.joined(separator: ","),
                        ]
                    }))
        }
        lines.append("")
        let skipped = self.skips.reduce(0) { $0 + $1.users }
        lines.append(self.skips.isEmpty ? "skipped users by reason: none" : "skipped users by reason:")
        if !self.skips.isEmpty {
            lines.append(
                TextTable.render(header: ["REASON", "USERS"], rows: self.skips.map { [$0.reason, String($0.users)] }))
            lines.append("(a user can have several reasons: \(skipped) in all; `metricsd skipped` lists the users)")
        }
        lines.append("")
        lines.append(self.jobs.isEmpty ? "recompute jobs: none" : "recompute jobs:")
        for job in self.jobs { lines.append("  " + OperatorSession.progressLine(job)) }
        lines.append("")
        lines.append(self.retentionLine)
        if let run = self.retention.latest {
            lines.append(
                "  latest run \(run.id): \(run.state)\(run.fullPass ? " (full pass)" : ""), cutoff \(run.cutoff), "
                    + "dates \(run.datesDone)/\(run.dates), \(run.removed) rows removed, created \(run.createdAt)"
                    + (run.finishedAt.map { ", finished \($0)" } ?? ""))
        }
        lines.append(self.historyMoveLine)
        lines.append("")
        lines.append("users by formula version of their latest metrics:")
        lines.append(
            TextTable.render(
                header: ["VERSION", "USERS"],
                rows: self.versions.map {
                    [
                        $0.version.map { "v\($0)" + ($0 == self.formulaVersion ? " (current)" : " (old)") }
                            ?? "no metrics", String($0.users),
                    ]
                }))
        return lines.joined(separator: "\n")
    }

    /// Each live instance's read servers: state, lag, and share of its latest reads.
    var readServerLines: [String] {
        guard !self.readServers.isEmpty else {
            return [
                "read servers: none (every latest read goes to DATABASE_URL; METRICSD_READ_DATABASE_URL names standbys)"
            ]
        }
        var totals: [String: Int] = [:]
        for row in self.readServers { totals[row.instance, default: 0] += row.status.reads }
        return [
            "read servers (latest reads; each instance's view at its last heartbeat):",
            TextTable.render(
                header: ["INSTANCE", "SERVER", "STATE", "LAG", "READS", "SHARE"],
                rows: self.readServers.map { row in
                    let total = totals[row.instance] ?? 0
                    return [
                        row.instance, row.status.server,
                        row.status.usable ? "in use" : "LEFT: \(row.status.problem ?? "-")",
                        row.status.lagSeconds.map { "\(($0 * 10).rounded() / 10) s" } ?? "-", String(row.status.reads),
                        total > 0 ? OperatorSession.percent(100 * Double(row.status.reads) / Double(total)) : "-",
                    ]
                }),
        ]
    }

    var retentionLine: String {
        guard self.retentionDays > 0 else { return "retention: off (METRICSD_RETENTION_DAYS=0: every row is kept)" }
        let behind = self.retention.behindSeconds
        return "retention: rows older than \(self.retentionDays) days are removed; "
            + (behind < 7200
                ? "caught up"
                : "behind by " + (behind < 172_800 ? OperatorSession.duration(behind) : "\(Int(behind / 86400)) days"))
    }

    /// Where the history stands: in monthly partitions from the start, being moved there (how far), or moved.
    var historyMoveLine: String {
        guard let move = self.historyMove else { return "history: in monthly partitions (nothing to move)" }
        let paused = self.historyMoveOn ? "" : " (METRICSD_HISTORY_MOVE=off here: other instances move it)"
        switch move.state {
        case .copying:
            return "history move: copying \(move.source) into monthly partitions\(paused): \(move.monthsCopied) of "
                + "\(move.months) months, \(move.rowsCopied) of ~\(move.rowsEstimate) rows "
                + "(\(OperatorSession.percent(100 * move.copiedFraction))), \(move.logEntries) writes to replay; "
                + "started \(move.createdAt)"
        case .indexing:
            return "history move: every month copied from \(move.source)\(paused); indexes built for "
                + "\(move.monthsReady) of \(move.months) months, \(move.logEntries) writes to replay; started \(move.createdAt)"
        case .swapped:
            return
                "history move: dropping \(move.source), the \(move.months) months attached in its place\(self.swapLock)"
        case .done:
            return
                "history: moved into monthly partitions (\(move.rowsCopied) rows of \(move.source) in \(move.months) "
                + "months, \(move.createdAt) to \(move.finishedAt.map { "\($0)" } ?? "-")\(self.swapLock))"
        }
    }

    private var swapLock: String {
        guard let milliseconds = self.historyMove?.swapLockMilliseconds else { return "" }
        return "; the swap held its locks for \(Int(milliseconds.rounded())) ms"
    }

    var historyMoveJSON: String {
        guard let move = self.historyMove else { return "null" }
        return JSONWriter.object([
            "source": .string(move.source), "state": .string(move.state.rawValue), "months": .int(Int64(move.months)),
            "monthsCopied": .int(Int64(move.monthsCopied)), "monthsReady": .int(Int64(move.monthsReady)),
            "rowsCopied": .int(move.rowsCopied), "rowsEstimate": .int(move.rowsEstimate),
            "writesToReplay": .int(move.logEntries), "createdAt": .timestamp(move.createdAt),
            "swapLockMilliseconds": move.swapLockMilliseconds.map { .double(($0 * 10).rounded() / 10) } ?? .null,
            "finishedAt": move.finishedAt.map { .timestamp($0) } ?? .null, "enabledHere": .bool(self.historyMoveOn),
        ])
    }

    var retentionJSON: String {
        let run = self.retention.latest.map { run in
            JSONWriter.object([
                "id": .int(run.id), "state": .string(run.state), "cutoff": .timestamp(run.cutoff),
                "fullPass": .bool(run.fullPass), "datesDone": .int(Int64(run.datesDone)),
                "dates": .int(Int64(run.dates)),
                "rowsRemoved": .int(run.removed), "createdAt": .timestamp(run.createdAt),
                "finishedAt": run.finishedAt.map { .timestamp($0) } ?? .null,
            ])
        }
        return JSONWriter.object([
            "days": .int(Int64(self.retentionDays)),
            "behindSeconds": self.retentionDays > 0
                ? .double((self.retention.behindSeconds * 10).rounded() / 10) : .null,
            "latestRun": run.map { .raw($0) } ?? .null,
        ])
    }

    var json: String {
        let instances = self.instances.map { instance in
            JSONWriter.object([
                "id": .string(instance.id), "host": .string(instance.host), "pid": .int(Int64(instance.pid)),
                "buildVersion": .string(instance.buildVersion), "formulaVersion": .int(Int64(instance.formulaVersion)),
                "listen": .string(instance.listen), "startedAt": .timestamp(instance.startedAt),
                "lastSeenAt": .timestamp(instance.lastSeenAt),
                "stoppedAt": instance.stoppedAt.map { .timestamp($0) } ?? .null, "alive": .bool(instance.alive),
            ])
        }
        let zones = self.zones.map { zone in
            JSONWriter.object([
                "timezone": .string(zone.timezone), "known": .bool(zone.known),
                "date": .string(zone.dueDate.description),
                "dueAt": .timestamp(zone.dueAt), "state": .string(zone.state.rawValue),
                "usersTotal": .int(Int64(zone.usersTotal)), "usersDone": .int(Int64(zone.usersDone)),
                "usersSkipped": .int(Int64(zone.usersSkipped)),
                "runningBy": .raw(JSONWriter.array(zone.runningBy.map { .string($0) })),
                "overdueSeconds": .double((zone.overdueSeconds * 10).rounded() / 10),
                "finishedLateSeconds": zone.finishedLateSeconds.map { .double(($0 * 10).rounded() / 10) } ?? .null,
            ])
        }
        return JSONWriter.object([
            "now": .timestamp(self.now),
            "formulaVersion": .int(Int64(self.formulaVersion)),
            "dailyAt": .string(self.dailyAt.description),
            "schema": .raw(
                JSONWriter.object([
                    "current": .bool(self.schema.isCurrent),
                    "latest": self.schema.latestApplied.map { .string($0) } ?? .null,
                    "pending": .raw(JSONWriter.array(self.schema.pending.map { .string($0) })),
                    "unknown": .raw(JSONWriter.array(self.schema.unknown.map { .string($0) })),
                ])),
            "instances": .raw("[" + instances.joined(separator: ",") + "]"),
            "units": .raw(
                JSONWriter.object([
                    "done": .int(Int64(self.count(.done))), "running": .int(Int64(self.count(.running))),
                    "pending": .int(Int64(self.count(.pending) + self.count(.missing))),
                    "overdue": .int(Int64(self.count(.overdue))),
                ])),
            "zones": .raw("[" + zones.joined(separator: ",") + "]"),
            "skippedByReason": .raw(
                "["
                    + self.skips.map {
                        JSONWriter.object(["reason": .string($0.reason), "users": .int(Int64($0.users))])
                    }
                    .joined(separator: ",") + "]"),
            "recomputeJobs": .raw("[" + self.jobs.map(AdminController.json).joined(separator: ",") + "]"),
            "retention": .raw(self.retentionJSON),
            "historyMove": .raw(self.historyMoveJSON),
            "readServers": .raw(
                "["
                    + self.readServers.map { row in
                        JSONWriter.object([
                            "instance": .string(row.instance), "server": .string(row.status.server),
                            "usable": .bool(row.status.usable),
                            "lagSeconds": row.status.lagSeconds.map { .double(($0 * 100).rounded() / 100) } ?? .null,
                            "reads": .int(Int64(row.status.reads)),
                            "problem": row.status.problem.map { .string($0) } ?? .null,
                            "updatedAt": .timestamp(row.updatedAt),
                        ])
                    }.joined(separator: ",") + "]"),
            "usersByFormulaVersion": .raw(
                "["
                    + self.versions.map {
                        JSONWriter.object([
                            "version": $0.version.map { .int(Int64($0)) } ?? .null, "users": .int(Int64($0.users)),
                        ])
                    }.joined(separator: ",") + "]"),
        ])
    }
}
