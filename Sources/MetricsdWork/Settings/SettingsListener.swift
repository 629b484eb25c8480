import HealthMetrics
import Logging
import MetricsdPostgres
import ServiceLifecycle

/// Recomputes a user's current row within seconds of a settings change.
///
/// A dedicated connection `LISTEN`s on `metricsd_settings` (the `user_settings` trigger NOTIFYs the user id) and
/// on `metricsd_work` (a recompute job was triggered: wake the workers). Notifications sent while it was
/// disconnected are lost, so a sweep of `user_settings.updated_at` runs after every (re)connect and every
/// `sweepInterval`. The refresh is idempotent across instances: a row computed after the change is left alone.
///
/// A LISTEN connection only reads, so a server that stops answering (stopped processes, a frozen VM, a middlebox
/// that dropped the connection's state) is never noticed by itself: TCP keepalives are answered by the kernel, and
/// nothing is ever sent whose acknowledgement could time out. So after ``checkInterval`` without a notification the
/// listener asks the server whether the session still listens on both channels, with at most
/// ``checkDeadlineSeconds`` to answer; a session that does not answer is dropped and the listener reconnects (and
/// sweeps what it missed).
///
/// Notifications are never assumed: after every (re)connect the listener sends one itself, from another session,
/// and listens only if it arrives within ``probeWait``. Through a transaction-mode pooler a LISTEN registers in
/// whichever server session ran it, and that session's notifications go to whichever client holds it next, or
/// nowhere; so on a pooled `DATABASE_URL` without `METRICSD_NOTIFY_DATABASE_URL` the listener does not LISTEN at
/// all (a stranded registration would misroute its channel's notifications for the session's lifetime). Without
/// notifications it polls: the sweep every `pollInterval`, reported in the log, `/readyz` and
/// `metricsd_notifications_usable`, and tries listening again every ``relistenInterval`` where it could work.
package struct SettingsListener: Service {
    /// How long the listener waits for the notification it sent itself.
    static let probeWait = Duration.seconds(2)
    /// How often a listener that polls because its notification did not arrive tries again.
    static let relistenInterval = Duration.seconds(60)
    /// Silence after which the LISTEN session is checked.
    static let checkInterval = Duration.seconds(5)
    /// The most a check waits for its answer (less when the statement deadline is shorter).
    static let checkDeadlineSeconds = 5.0

    let pool: PostgresPool
    let queue: WorkQueue
    let signal: WorkSignal
    let sweepInterval: Duration
    let logger: Logger
    /// Where to LISTEN (`METRICSD_NOTIFY_DATABASE_URL`); nil: `DATABASE_URL`, unless it goes through a pooler.
    let notifySettings: ConnectionSettings?
    /// How often settings changes are swept for while notifications do not work.
    let pollInterval: Duration
    let status: NotificationStatus

    package init(
        pool: PostgresPool, queue: WorkQueue, signal: WorkSignal, sweepInterval: Duration, logger: Logger,
        notifySettings: ConnectionSettings? = nil, pollInterval: Duration = .seconds(2),
        status: NotificationStatus = NotificationStatus()
    ) {
        self.pool = pool
        self.queue = queue
        self.signal = signal
        self.sweepInterval = sweepInterval
        self.logger = logger
        self.notifySettings = notifySettings
        self.pollInterval = pollInterval
        self.status = status
    }

    package func run() async throws {
        var watermark: String?
        var lastProblem: String?
        var failures = 0
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                let connection = try await self.openConnection()
                if watermark == nil {
                    // Start ten minutes back: changes made while no daemon was running get picked up.
                    watermark = try await self.pool.runBlocking {
                        try connection.query("SELECT (now() - interval '10 minutes')::text").requiredString(0, 0)
                    }
                }
                if let reason = try await self.unusable(connection) {
                    if lastProblem != reason {
                        self.logger.warning(
                            "Notifications do not arrive; polling for settings changes",
                            metadata: [
                                "metricsd.reason": "\(reason)",
                                "metricsd.poll.seconds": "\(Double(self.pollInterval / .milliseconds(1)) / 1000)",
                            ])
                        lastProblem = reason
                    }
                    self.status.polling(every: Double(self.pollInterval / .milliseconds(1)) / 1000, because: reason)
                    let structural = self.notifySettings == nil && connection.isPooled
                    watermark = try await self.poll(since: watermark!, for: structural ? nil : Self.relistenInterval)
                    continue
                }
                self.status.listening()
                // Work queued before this session listened (a recompute job created between READY and now, or
                // while the probe above waited: its notifications are not kept) would otherwise wait for the
                // workers' idle poll: they look once now.
                self.signal.notify()
                if lastProblem != nil { self.logger.info("Listening for settings changes again") }
                lastProblem = nil
                failures = 0
                watermark = try await self.sweep(since: watermark!)
                try await self.listen(on: connection, watermark: &watermark)
            } catch {
                let problem = "\(error)"
                if problem != lastProblem {
                    self.logger.warning("Settings listener disconnected; retrying", metadata: .errorFields(error))
                    lastProblem = problem
                }
                failures += 1
                let backoff = Duration.milliseconds(min(30_000, 250 << min(failures, 7)))
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: backoff) }
            }
        }
    }

    /// The LISTEN session: on `METRICSD_NOTIFY_DATABASE_URL` when set, else a dedicated session of the pool's.
    private func openConnection() async throws -> PostgresConnection {
        try await self.pool.openDedicatedConnection(settings: self.notifySettings)
    }

    /// Nil when `connection` listens and hears a notification sent from another session within ``probeWait``;
    /// else why not. A pooled `DATABASE_URL` (no notification URL) is not even tried.
    private func unusable(_ connection: PostgresConnection) async throws -> String? {
        if self.notifySettings == nil && connection.isPooled {
            return "DATABASE_URL goes through a connection pooler and METRICSD_NOTIFY_DATABASE_URL is not set"
        }
        try await self.pool.runBlocking { try connection.execute("LISTEN metricsd_settings; LISTEN metricsd_work") }
        let nonce = "probe:" + String(UInt64.random(in: 1...UInt64.max), radix: 16)
        // From a pool session, never the listener's own: through a pooler that could come back over the very server
        // session that holds the registration, and pass while nothing else would.
        _ = try await self.pool.withConnection { try $0.query("SELECT pg_notify('metricsd_settings', $1)", [nonce]) }
        let deadline = ContinuousClock.now + Self.probeWait
        while ContinuousClock.now < deadline {
            let left = Int32(max(10, ((deadline - ContinuousClock.now) / .milliseconds(1)).rounded(.up)))
            let notifications = try await self.pool.runBlocking {
                try connection.waitForNotifications(timeoutMilliseconds: left)
            }
            // Other notifications meanwhile are left to the sweep that follows (settings) and to the workers' look
            // once the session listens (work).
            if notifications.contains(where: { $0.payload == nonce }) { return nil }
        }
        let place = self.notifySettings == nil ? "DATABASE_URL" : "METRICSD_NOTIFY_DATABASE_URL"
        return "a notification sent through DATABASE_URL did not arrive on \(place) within \(Self.probeWait)"
    }

    /// Sweeps for settings changes every ``pollInterval`` for `limit` (nil: until the daemon stops).
    private func poll(since: String, for limit: Duration?) async throws -> String {
        var watermark = since
        let started = ContinuousClock.now
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            watermark = try await self.sweep(since: watermark)
            if let limit, ContinuousClock.now - started >= limit { break }
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: self.pollInterval) }
        }
        return watermark
    }

    private func listen(on connection: PostgresConnection, watermark: inout String?) async throws {
        // A stop ends the wait at once (a restart holds clients in the socket's backlog while it waits).
        let interrupter = try WaitInterrupter()
        try await withGracefulShutdownHandler {
            try await withTaskCancellationHandler {
                try await self.listen(on: connection, watermark: &watermark, interrupter: interrupter)
            } onCancel: {
                interrupter.interrupt()
            }
        } onGracefulShutdown: {
            interrupter.interrupt()
        }
    }

    private func listen(on connection: PostgresConnection, watermark: inout String?, interrupter: WaitInterrupter)
        async throws
    {
        var lastSweep = ContinuousClock.now
        var lastHeard = ContinuousClock.now
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            // Until the next sweep or check is due: notifications and a stop end the wait sooner.
            let untilSweep = self.sweepInterval - (ContinuousClock.now - lastSweep)
            let untilCheck = Self.checkInterval - (ContinuousClock.now - lastHeard)
            let timeout = Int32(min(60_000, max(10, (min(untilSweep, untilCheck) / .milliseconds(1)).rounded(.up))))
            let notifications = try await self.pool.runBlocking {
                try connection.waitForNotifications(timeoutMilliseconds: timeout, interrupter: interrupter)
            }
            if !notifications.isEmpty {
                lastHeard = ContinuousClock.now
            } else if ContinuousClock.now - lastHeard >= Self.checkInterval {
                try await self.check(connection)
                lastHeard = ContinuousClock.now
            }
            var users: Set<Int64> = []
            for notification in notifications {
                switch notification.channel {
                case "metricsd_settings":
                    if let id = Int64(notification.payload) { users.insert(id) }
                case "metricsd_work":
                    self.signal.notify()
                default:
                    break
                }
            }
            if !users.isEmpty {
                let written = try await self.queue.refreshUsers(users.sorted())
                self.logger.debug(
                    "Settings changed; metrics refreshed",
                    metadata: ["metricsd.users": "\(users.count)", "metricsd.rows.written": "\(written)"])
            }
            if ContinuousClock.now - lastSweep >= self.sweepInterval, let since = watermark {
                watermark = try await self.sweep(since: since)
                lastSweep = ContinuousClock.now
            }
        }
    }

    /// Asks the LISTEN session whether it still listens on both channels, within ``checkDeadlineSeconds``; throws
    /// (the caller reconnects) when it does not answer in time or no longer listens.
    private func check(_ connection: PostgresConnection) async throws {
        let listening = try await self.pool.runBlocking {
            let deadline = connection.statementDeadlineSeconds
            connection.statementDeadlineSeconds = min(deadline ?? Self.checkDeadlineSeconds, Self.checkDeadlineSeconds)
            defer { connection.statementDeadlineSeconds = deadline }
            return try connection.query(
                "SELECT count(*) FROM pg_listening_channels() c WHERE c IN ('metricsd_settings', 'metricsd_work')"
            ).int(0, 0)
        }
        guard listening == 2 else {
            throw PostgresError(
                code: .connectionLost, message: "the settings listener's session no longer listens on its channels")
        }
    }

    /// Refreshes users whose settings changed after `since` (minus five minutes for transactions that committed
    /// late) and whose metrics are older than the change. Returns the new watermark.
    private func sweep(since: String) async throws -> String {
        var watermark = since
        // A sweep can be long (thousands of users after an outage): it stops between batches when the daemon stops.
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            let (ids, next) = try await self.queue.staleSettings(since: watermark, overlapMinutes: 5)
            if !ids.isEmpty {
                let written = try await self.queue.refreshUsers(ids)
                self.logger.info(
                    "Settings sweep refreshed metrics",
                    metadata: ["metricsd.users": "\(ids.count)", "metricsd.rows.written": "\(written)"])
            }
            guard let next else { return watermark }
            watermark = next
            if ids.count < 5000 { return watermark }
        }
        return watermark
    }
}
