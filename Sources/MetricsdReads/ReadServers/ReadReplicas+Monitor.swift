import Logging
import MetricsdPostgres
import MetricsdWork
import NIOPosix
import ServiceLifecycle
import Synchronization

extension ReadReplicas: Service {
    /// The monitor, until the group shuts down: one loop samples the primary's WAL position and identity, one
    /// loop per read server probes its role, identity and replay position, each every ``probeInterval`` on a
    /// dedicated connection; one more loop records every server's gauges (usable, lag, problem) at the same pace,
    /// so that they follow the clock even while a probe waits for a server that does not answer. Loops are
    /// independent, so a server that takes its bound to fail delays no other. The primary is sampled once before
    /// any server is probed, so that a server found fresh is not first announced as unknown.
    public func run() async {
        var primary = PrimarySampler()
        await self.sample(&primary)
        await withDiscardingTaskGroup { group in
            group.addTask { [primary] in
                var sampler = primary
                while self.running {
                    await self.pause()
                    await self.sample(&sampler)
                }
                await self.close(sampler.connection, on: self.threads)
            }
            for server in self.servers {
                group.addTask { await self.probe(server) }
            }
            group.addTask {
                while self.running {
                    await self.pause()
                    for server in self.servers { self.update(server) }
                }
            }
        }
    }

    private var running: Bool { !Task.isShuttingDownGracefully && !Task.isCancelled }

    private func pause() async {
        try? await cancelWhenGracefulShutdown { try await Task.sleep(for: self.probeInterval) }
    }

    /// The primary sampler's session, and whether its last sample failed.
    struct PrimarySampler: Sendable {
        var connection: UnsafeTransfer<PostgresConnection>?
        var failing = false
    }

    /// Records the primary's WAL insert position with the instant just before it was asked, and its identity.
    private func sample(_ sampler: inout PrimarySampler) async {
        let settings = self.primary.settings
        let deadline = self.readDeadlineSeconds
        let asked = ContinuousClock.now
        do {
            let open = sampler.connection
            let (session, position, identity) = try await self.threads.runIfActive {
                let session = try open?.value ?? PostgresConnection(settings: settings)
                session.statementDeadlineSeconds = deadline
                let result = try session.query(
                    "SELECT (pg_current_wal_insert_lsn() - '0/0')::text, \(Self.identityColumns)")
                return (UnsafeTransfer(session), try Self.position(result), try Self.identity(result, from: 1))
            }
            sampler.connection = session
            self.primaryIdentity.withLock { $0 = identity }
            self.history.withLock { $0.record(at: asked, position: position) }
            if sampler.failing { self.logger.debug("Primary's WAL position known again") }
            sampler.failing = false
        } catch {
            await self.close(sampler.connection, on: self.threads)
            sampler.connection = nil
            if !sampler.failing {
                // The primary's trouble is reported by /readyz and the pool; here it only means that no read
                // server can be shown to be fresh until the primary answers again.
                self.logger.debug("Primary's WAL position not known", metadata: ["metricsd.error": "\(error)"])
            }
            sampler.failing = true
        }
    }

    /// Drops a dedicated session on a pool thread (closing it may block).
    private func close(_ connection: UnsafeTransfer<PostgresConnection>?, on threads: NIOThreadPool) async {
        guard let connection else { return }
        _ = try? await threads.runIfActive { _ = connection }
    }

    /// What one probe of a read server found.
    struct Probe: Sendable {
        let inRecovery: Bool
        /// The WAL position it has replayed (a primary: its own insert position).
        let replayed: UInt64?
        let paused: Bool
        let identity: Identity
    }

    /// Asks a read server, on its probe session, its role, identity and replay position.
    private static func ask(_ session: PostgresConnection) throws -> Probe {
        let result = try session.query(
            """
            SELECT pg_is_in_recovery(),
                   (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                         ELSE pg_current_wal_insert_lsn() END - '0/0')::text,
                   CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END,
                   \(Self.identityColumns)
            """)
        return Probe(
            inRecovery: try result.bool(0, 0), replayed: try result.string(0, 1).map { try Self.position(text: $0) },
            paused: try result.bool(0, 2), identity: try Self.identity(result, from: 3))
    }

    /// Probes `server`: reachable, in recovery or not, whether it follows the primary (its role is checked at every
    /// probe, not only when connecting: a standby promoted under a running daemon is left within a probe), the WAL
    /// position it has replayed (a primary: its own).
    private func probe(_ server: Server) async {
        var connection: UnsafeTransfer<PostgresConnection>?
        let settings = server.pool.settings
        while self.running {
            do {
                let open = connection
                let (session, found) = try await server.pool.runBlocking {
                    let session = try open?.value ?? PostgresConnection(settings: settings)
                    return (UnsafeTransfer(session), try Self.ask(session))
                }
                connection = session
                let mismatch = Self.mismatch(
                    observed: found.identity, inRecovery: found.inRecovery, standbysOnly: server.standbysOnly,
                    primary: self.primaryIdentity.withLock { $0 })
                let fresh = found.replayed.flatMap { position in
                    self.history.withLock { $0.freshness(replayed: position) }
                }
                self.update(server) { state in
                    // A server that was down may come back behind where it was (a standby restarted after a crash
                    // replays again from its last restartpoint): only this probe says how fresh it is now. One that
                    // stayed up only moves forward: behind every sample kept, it keeps its last freshness, and its
                    // lag keeps growing.
                    if let fresh {
                        state.freshAsOf = fresh
                    } else if !state.up {
                        state.freshAsOf = nil
                    }
                    state.up = true
                    state.failure = nil
                    state.unanswered = false
                    state.mismatch = mismatch
                    state.replayPaused = found.paused
                }
            } catch {
                await self.close(connection, on: server.pool.threadPool)
                connection = nil
                let summary = (error as? PostgresError)?.summary ?? "\(error)"
                self.update(server) { state in
                    state.up = false
                    state.failure = summary
                    state.unanswered = (error as? PostgresError)?.isUnanswered ?? false
                }
            }
            await self.pause()
        }
        await self.close(connection, on: server.pool.threadPool)
    }

    private static func position(_ result: PostgresResult) throws -> UInt64 {
        try self.position(text: result.requiredString(0, 0))
    }

    /// A WAL position as bytes since 0/0 (`lsn - '0/0'`, a numeric printed without fraction).
    private static func position(text: String) throws -> UInt64 {
        guard let value = UInt64(text) else {
            throw PostgresError(code: .unexpectedResult, message: "WAL position \(text) is not a whole number")
        }
        return value
    }
}
