import Glibc
import HealthMetrics
import Logging
import MetricsdConfiguration
import MetricsdDaemon
import MetricsdHTTP
import MetricsdPostgres
import MetricsdSystemd
import MetricsdWork
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The operator commands that talk to the database directly, so they work with no daemon running.
public struct OperatorSession: Sendable {
    let configuration: Configuration
    let pool: PostgresPool
    let logger: Logger
    /// `METRICSD_NOTIFY_DATABASE_URL`: where to LISTEN when `DATABASE_URL` goes through a pooler.
    var notifySettings: ConnectionSettings?
    /// How long a waiting command rides through a lost database (a failover) before it gives up.
    static let reconnectDeadline = Duration.seconds(120)

    /// A failure to report as one line (`Error: … [code]`) with exit code 1.
    public struct Failure: CodedError {
        public let message: String
        public let errorCode: String
        public init(_ message: String, code: String) {
            self.message = message
            self.errorCode = code
        }
        /// What the `Error:` line shows: the message and the code.
        public var description: String { "\(self.message) [\(self.errorCode)]" }

        /// The commands' own codes (the rest are those of the configuration, the database and the API).
        public static let jobFailed = "job.failed"
        public static let jobCancelled = "job.cancelled"
        public static let schemaMissing = "schema.missing"
        public static let commandCodes = [jobFailed, jobCancelled, schemaMissing]
    }

    /// Sets up configuration, logging (warnings and up on stderr) and a small pool, runs `body`, and closes the pool.
    public static func run(_ body: (OperatorSession) async throws -> Void) async throws {
        let environment: [String: String]
        let configuration: Configuration
        let host: HostEnvironment
        let processEnvironment = ProcessInfo.processInfo.environment
        do {
            host = try HostEnvironment(processEnvironment)
            environment = try ConfigFile.merge(into: host.environment)
            configuration = try Configuration(environment: environment)
        } catch {
            throw Failure("configuration error: \(error)", code: error.errorCode)
        }
        let level = LogLevelBox(.warning)
        LoggingSystem.bootstrap { label in
            LogSetup.makeHandler(label: label, format: .text, level: level, environment: [:])
        }
        let logger = Logger(label: "metricsd")
        let settings: ConnectionSettings
        let notifySettings: ConnectionSettings?
        do {
            settings = try configuration.database.primary(environment: environment)
            notifySettings = try configuration.database.notify(environment: environment)
        } catch {
            throw Failure("configuration error: \(error)", code: error.errorCode)
        }
        let pool = PostgresPool(
            settings: settings, configuration: .init(size: 2, acquireTimeout: .seconds(30)), logger: logger)
        let tool = OperatorSession(
            configuration: configuration, pool: pool, logger: logger, notifySettings: notifySettings)
        do {
            try await body(tool)
            await pool.close()
        } catch let error as PostgresError {
            await pool.close()
            switch error.code {
            case .connectionFailed:
                let origin = host.origin(of: "DATABASE_URL", environment: processEnvironment, merged: environment)
                throw Failure(Self.connectionFailure(error.message, databaseURLOrigin: origin), code: error.errorCode)
            default: throw Failure("database error: \(error)", code: error.errorCode)
            }
        } catch {
            await pool.close()
            throw error
        }
    }

    /// A failed connection in words that say what to change: which `DATABASE_URL` was used, where it came from,
    /// and where a checkout's demo database is.
    static func connectionFailure(_ message: String, databaseURLOrigin origin: String) -> String {
        let reason = ConfigCheck.oneLine(message)
        return "cannot connect to the database: \(reason) (DATABASE_URL is \(origin): set it to metricsd's "
            + "database, exported or in \(HostEnvironment.defaultEnvironmentFile); for a checkout's demo, the export "
            + "lines scripts/run prints)"
    }

    // MARK: migrate

    public func migrate(dryRun: Bool) async throws {
        let migrator = Migrator(directSettings: self.notifySettings)
        if dryRun {
            let status = try await self.pool.withConnection { try migrator.status(on: $0) }
            Self.print("applied: \(migrator.migrations.count - status.pending.count), pending: \(status.pending.count)")
            for name in status.pending { Self.print("  pending \(name)") }
            for name in status.changed { Self.print("  CHANGED after being applied: \(name)") }
            return
        }
        let logger = self.logger
        do {
            let applied = try await self.pool.withConnection { try migrator.migrate(on: $0, logger: logger) }
            if applied.isEmpty {
                Self.print("schema is current (\(migrator.migrations.count) migrations applied)")
            } else {
                for name in applied { Self.print("applied \(name)") }
            }
        } catch let error as MigrationError {
            throw Failure(error.message, code: error.errorCode)
        }
    }

    // MARK: recompute

    var jobs: RecomputeJobs { RecomputeJobs(pool: self.pool, chunkSize: self.configuration.work.chunkSize) }

    public func recomputeAll(wait: Bool) async throws {
        let version = self.configuration.formula.version
        let outcome = try await self.jobs.trigger(version: version, requestedBy: "cli")
        Self.print(AdminController.message(outcome, version: version))
        guard let job = outcome.job, !job.state.isFinished else { return }  // nothing to do
        let alive = try await StatusQueries(pool: self.pool).instances().filter {
            $0.alive && $0.formulaVersion == version
        }
        if alive.isEmpty {
            Self.print(
                "note: no running metricsd with formula version \(version) was seen in the last minute; the job starts when one runs"
            )
        }
        guard wait else { return }
        try await self.follow(jobID: job.id)
    }

    /// Shows progress until the job finishes: a redrawn bar on a terminal, a line every 5 s otherwise.
    ///
    /// The end is told, not polled: a dedicated connection `LISTEN`s on `metricsd_recompute`, which the job's
    /// last transaction NOTIFYs at its commit, so this returns within milliseconds of the job's end. The job is
    /// read again at least every 2 s too (progress, and safety should the connection fail).
    func follow(jobID: Int64) async throws {
        let terminal = isatty(STDOUT_FILENO) == 1
        let listener: Listener?
        do {
            listener = try await self.listen(channel: "metricsd_recompute")
        } catch {
            self.logger.warning("Cannot listen for the job's end; reading it every 2 s", metadata: .errorFields(error))
            listener = nil
        }
        var lastLine = ContinuousClock.now - .seconds(10)
        while true {
            guard let job = try await self.ridingThroughFailover({ try await self.jobs.job(id: jobID) }) else {
                throw Failure("recompute job \(jobID) vanished", code: AppError.Code.jobNotFound.rawValue)
            }
            if terminal {
                StandardOutput.write("\r" + Self.progressBar(job) + "\u{1B}[K")
            } else if ContinuousClock.now - lastLine >= .seconds(5) || job.state.isFinished {
                Self.print(Self.progressLine(job))
                lastLine = ContinuousClock.now
            }
            if job.state.isFinished {
                if terminal { Self.print("") }
                switch job.state {
                case .done:
                    Self.print("recompute job \(job.id) done: \(job.counts.summary)")
                    return
                default:
                    throw Failure(
                        "recompute job \(job.id) \(job.state.rawValue)\(job.lastError.map { ": \($0)" } ?? "")",
                        code: job.state == .cancelled ? Failure.jobCancelled : Failure.jobFailed)
                }
            }
            let wait: Int32 = terminal ? 500 : 2000
            if let listener {
                let prefix = "\(jobID) "
                let ended = try? await self.pool.runBlocking {
                    try listener.connection.waitForNotifications(timeoutMilliseconds: wait)
                        .contains { $0.payload.hasPrefix(prefix) }
                }
                if ended == nil { try await Task.sleep(for: .milliseconds(Int64(wait))) }  // connection lost: poll
            } else {
                try await Task.sleep(for: .milliseconds(Int64(wait)))
            }
        }
    }

    /// A connection of its own that `LISTEN`s on `channel` (closed when released).
    private struct Listener: @unchecked Sendable {
        let connection: PostgresConnection
    }

    /// Listens on `METRICSD_NOTIFY_DATABASE_URL`, else on `DATABASE_URL` unless it goes through a pooler (which
    /// would strand the LISTEN in one of its server sessions): then throws, and the caller polls.
    private func listen(channel: String) async throws -> Listener {
        let connection = try await self.pool.openDedicatedConnection(settings: self.notifySettings)
        if self.notifySettings == nil && connection.isPooled {
            throw PostgresError(
                code: .connectionFailed,
                message: "DATABASE_URL goes through a connection pooler and METRICSD_NOTIFY_DATABASE_URL is not set")
        }
        let listener = Listener(connection: connection)
        try await self.pool.runBlocking { try listener.connection.execute("LISTEN \(channel)") }
        return listener
    }

    /// Runs `body` again while the database is lost or refuses connections (a failover: the old primary gone, the
    /// new one not yet answering, HAProxy closing what it accepted), saying so once per outage, for at most
    /// ``reconnectDeadline`` from the first failure; any other error, and a lost database past that, is thrown.
    func ridingThroughFailover<T>(_ body: () async throws -> T) async throws -> T {
        var since: ContinuousClock.Instant?
        while true {
            do {
                let value = try await body()
                if since != nil { Self.print("the database answers again") }
                return value
            } catch let error as PostgresError where Self.isTransient(error) {
                let first = since ?? ContinuousClock.now
                if since == nil {
                    Self.print(
                        "waiting for the database (\(error.message.split(separator: "\n").first ?? "")); retrying for up to \(Self.reconnectDeadline)"
                    )
                }
                since = first
                guard ContinuousClock.now - first < Self.reconnectDeadline else { throw error }
                try await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// A lost or refused connection, a server shutting down or starting, a standby that refuses writes.
    static func isTransient(_ error: PostgresError) -> Bool {
        if error.code == .connectionLost || error.code == .connectionFailed { return true }
        guard let state = error.sqlState else { return false }
        return state.hasPrefix("08") || ["57P01", "57P02", "57P03", "25006"].contains(state)
    }

    public func recomputeStatus(id: Int64?, json: Bool) async throws {
        let jobs: [RecomputeJob]
        if let id {
            guard let job = try await self.jobs.job(id: id) else {
                throw Failure("no recompute job \(id)", code: AppError.Code.jobNotFound.rawValue)
            }
            jobs = [job]
        } else {
            jobs = try await self.jobs.recent(limit: 10)
        }
        if json {
            Self.print(
                id == nil
                    ? "[" + jobs.map(AdminController.json).joined(separator: ",") + "]" : AdminController.json(jobs[0]))
            return
        }
        if jobs.isEmpty { Self.print("no recompute jobs") }
        for job in jobs { Self.print(Self.progressLine(job)) }
    }

    public func recomputeCancel(id: Int64) async throws {
        switch try await self.jobs.cancel(id: id) {
        case .cancelled(let job):
            Self.print("recompute job \(id) cancelled at \(Self.percent(job.percent)); trigger again to continue")
        case .alreadyFinished(let job):
            throw Failure(
                "recompute job \(id) is already \(job.state.rawValue)", code: AppError.Code.jobFinished.rawValue)
        case .notFound: throw Failure("no recompute job \(id)", code: AppError.Code.jobNotFound.rawValue)
        }
    }

    static func progressLine(_ job: RecomputeJob) -> String {
        var parts = [
            "job \(job.id)", "version \(job.version)", job.state.rawValue, Self.percent(job.percent),
            "\(job.usersExamined)/\(job.usersTotal) users examined", "written \(job.usersWritten)",
            "already current \(job.usersAlreadyCurrent)", "skipped \(job.usersSkipped)",
        ]
        if let rate = job.ratePerSecond { parts.append("\(Int(rate.rounded()))/s") }
        if let eta = job.etaSeconds { parts.append("ETA \(Self.duration(eta))") }
        parts.append("created \(job.createdAt)")
        if let started = job.startedAt { parts.append("started \(started)") }
        if let finished = job.finishedAt { parts.append("finished \(finished)") }
        if let error = job.lastError { parts.append("last error: \(error)") }
        return parts.joined(separator: "  ")
    }

    static func progressBar(_ job: RecomputeJob) -> String {
        let width = 30
        let filled = Int((job.percent / 100 * Double(width)).rounded(.down))
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        var text = "[\(bar)] \(Self.percent(job.percent))  \(job.usersExamined)/\(job.usersTotal) examined"
        if let rate = job.ratePerSecond { text += "  \(Int(rate.rounded()))/s" }
        if let eta = job.etaSeconds { text += "  ETA \(Self.duration(eta))" }
        return text
    }

    static func percent(_ value: Double) -> String {
        // One decimal, rounded half away from zero (printf's %.1f rounds the binary value; the difference is
        // invisible in a progress figure).
        guard value.isFinite, abs(value) < 1e15 else { return "\(value)%" }
        let tenths = Int((value * 10).rounded())
        return "\(tenths < 0 ? "-" : "")\(abs(tenths) / 10).\(abs(tenths) % 10)%"
    }

    static func twoDigits(_ value: Int) -> String {
        value < 10 ? "0\(value)" : "\(value)"
    }

    static func duration(_ seconds: Double) -> String {
        let total = Int(seconds.rounded())
        if total < 60 { return "\(total)s" }
        if total < 3600 { return "\(total / 60)m\(Self.twoDigits(total % 60))s" }
        return "\(total / 3600)h\(Self.twoDigits(total / 60 % 60))m"
    }

    // MARK: skipped

    public func skipped(limit: Int, json: Bool) async throws {
        let users = try await StatusQueries(pool: self.pool).skippedUsers(limit: limit)
        if json {
            Self.print(
                "["
                    + users.map { user in
                        JSONWriter.object([
                            "userId": .int(user.userID),
                            "reasonCodes": .raw(JSONWriter.array(user.reasonCodes.map { .string($0) })),
                            "reasons": .string(user.reasons),
                            "metricsDate": user.metricsDate.map { .string($0.description) } ?? .null,
                            "version": .int(Int64(user.version)), "source": .string(user.source),
                            "recordedAt": .timestamp(user.recordedAt),
                        ])
                    }.joined(separator: ",") + "]")
            return
        }
        if users.isEmpty {
            Self.print("no skipped users")
            return
        }
        let rows = users.map { user in
            [
                String(user.userID), user.reasonCodes.joined(separator: ","), user.metricsDate?.description ?? "-",
                user.source, user.reasons,
            ]
        }
        Self.print(TextTable.render(header: ["USER", "REASON", "DATE", "SOURCE", "WHY"], rows: rows))
    }

    // MARK: status

    public func status(json: Bool) async throws {
        let report = try await StatusReport.gather(
            pool: self.pool, dailyAt: self.configuration.dailyAt, formula: self.configuration.formula,
            retentionDays: self.configuration.retentionDays, historyMoveOn: self.configuration.historyMove)
        Self.print(json ? report.json : report.text + "\n\n" + (await self.notificationsLine()))
    }

    /// Whether the daemons of this configuration hear notifications, found out as they do: a notification sent
    /// through `DATABASE_URL` must arrive, within 2 s, where they LISTEN.
    func notificationsLine() async -> String {
        let poll = "polled every \(Setting.format(self.configuration.idlePoll.seconds)) s"
        let place = self.notifySettings == nil ? "DATABASE_URL" : "METRICSD_NOTIFY_DATABASE_URL"
        do {
            let listener = Listener(
                connection: try await self.pool.openDedicatedConnection(settings: self.notifySettings))
            if self.notifySettings == nil && listener.connection.isPooled {
                return
                    "notifications: \(poll) (DATABASE_URL goes through a connection pooler and METRICSD_NOTIFY_DATABASE_URL is not set)"
            }
            try await self.pool.runBlocking { try listener.connection.execute("LISTEN metricsd_status_probe") }
            let nonce = String(UInt64.random(in: 1...UInt64.max), radix: 16)
            let sent = ContinuousClock.now
            _ = try await self.pool.withConnection {
                try $0.query("SELECT pg_notify('metricsd_status_probe', $1)", [nonce])
            }
            while ContinuousClock.now - sent < .seconds(2) {
                let arrived = try await self.pool.runBlocking {
                    try listener.connection.waitForNotifications(timeoutMilliseconds: 200).contains {
                        $0.payload == nonce
                    }
                }
                if arrived { return "notifications: arrive on \(place) (LISTEN)" }
            }
            return
                "notifications: \(poll): a notification sent through DATABASE_URL did not arrive on \(place) within 2 s"
        } catch {
            return "notifications: not checked (\(error))"
        }
    }

    // MARK: healthcheck

    /// `GET /readyz` on the running daemon: 0 when ready, else 1 and a one-line reason on stderr.
    public static func healthcheck(address: String?, timeout: Double, environment base: [String: String]) async -> Int32
    {
        let environment: [String: String]
        do {
            environment = try ConfigFile.merge(into: HostEnvironment(base).environment)
        } catch {
            StandardError.write("not ready: configuration error: \(error)\n")
            return 1
        }
        let tls = (environment["METRICSD_TLS"] ?? "off").lowercased()
        var text =
            address ?? environment["METRICSD_LISTEN"].flatMap { $0.isEmpty ? nil : $0 } ?? SettingsCatalog.defaultListen
        // It speaks plain HTTP: with TLS on the public listener, the internal one answers (when it is plain TCP).
        if address == nil && (tls == "public" || tls == "both") {
            let internalAddress = environment["METRICSD_INTERNAL_LISTEN"].flatMap { ListenAddress(parsing: $0) }
            guard tls == "public", let internalAddress, internalAddress.unixPath == nil else {
                StandardError.write(
                    "not ready: cannot ask \(text): it speaks TLS (METRICSD_TLS=\(tls)); give --address of a plain listener\n"
                )
                return 1
            }
            text = internalAddress.description
        }
        guard let listen = ListenAddress(parsing: text), listen.unixPath == nil else {
            StandardError.write("not ready: '\(text)' is not host:port\n")
            return 1
        }
        let host = listen.host == "0.0.0.0" ? "127.0.0.1" : (listen.host == "::" ? "::1" : listen.host)
        switch SimpleHTTP.get(host: host, port: listen.port, path: "/readyz", timeout: timeout) {
        case .success(let response) where response.status == 200:
            Self.print("ready")
            return 0
        case .success(let response):
            let reason = Self.readinessReason(response.body) ?? "HTTP \(response.status)"
            StandardError.write("not ready: \(reason)\n")
            return 1
        case .failure(let error):
            StandardError.write("not ready: \(listen): \(error)\n")
            return 1
        }
    }

    static func readinessReason(_ body: String) -> String? {
        struct Readiness: Decodable { let reason: String? }
        return (try? JSONDecoder().decode(Readiness.self, from: Data(body.utf8)))?.reason
    }

    static func print(_ line: String) {
        StandardOutput.write(line + "\n")
    }
}
