import MetricsdPostgres
import MetricsdReads

/// The heartbeat rows of running daemons (`metricsd_instances`), for `metricsd status`.
public struct Instances: Sendable {
    public struct Identity: Sendable, Hashable {
        /// `host:pid:random`; also the lease owner written on the chunks it claims.
        public let id: String
        public let host: String
        public let pid: Int32
        public let buildVersion: String
        public let formulaVersion: Int
        public let listen: String

        public init(id: String, host: String, pid: Int32, buildVersion: String, formulaVersion: Int, listen: String) {
            self.id = id
            self.host = host
            self.pid = pid
            self.buildVersion = buildVersion
            self.formulaVersion = formulaVersion
            self.listen = listen
        }
    }

    public let pool: PostgresPool

    public init(pool: PostgresPool) {
        self.pool = pool
    }

    /// Records that `identity` is alive now (inserting its row on the first beat), and what its latest reads see
    /// of their read servers, when it has any.
    public func beat(_ identity: Identity, readServers: [ReadReplicas.ServerStatus] = []) async throws {
        _ = try await self.pool.withConnection(retryOnConnectionLoss: true) { session in
            try session.transaction { connection in
                try connection.prepared(
                    "instance_beat",
                    """
                    INSERT INTO metricsd_instances (instance_id, host, pid, build_version, formula_version, listen,
                                                    started_at, last_seen_at)
                    VALUES ($1, $2, $3, $4, $5, $6, now(), now())
                    ON CONFLICT (instance_id) DO UPDATE SET last_seen_at = now(), stopped_at = NULL, listen = excluded.listen
                    """,
                    [
                        identity.id, identity.host, String(identity.pid), identity.buildVersion,
                        String(identity.formulaVersion),
                        identity.listen,
                    ])
                for server in readServers {
                    try connection.prepared(
                        "instance_read_server",
                        """
                        INSERT INTO metricsd_read_servers (instance_id, server, usable, lag_seconds, reads, problem, updated_at)
                        VALUES ($1, $2, $3, $4, $5, $6, now())
                        ON CONFLICT (instance_id, server) DO UPDATE
                          SET usable = excluded.usable, lag_seconds = excluded.lag_seconds, reads = excluded.reads,
                              problem = excluded.problem, updated_at = excluded.updated_at
                        """,
                        [
                            identity.id, server.server, server.usable ? "true" : "false",
                            server.lagSeconds.map { String($0) },
                            String(server.reads), server.problem,
                        ])
                }
            }
        }
    }

    /// Records a clean stop, and forgets instances not seen for a week.
    public func stopped(_ identity: Identity) async throws {
        _ = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.prepared(
                "instance_stopped",
                """
                WITH gone AS (DELETE FROM metricsd_instances WHERE last_seen_at < now() - interval '7 days')
                UPDATE metricsd_instances SET stopped_at = now(), last_seen_at = now() WHERE instance_id = $1
                """, [identity.id])
        }
    }
}
