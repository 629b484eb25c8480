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

    /// Records that `identity` is alive now (inserting its row on the first beat).
    public func beat(_ identity: Identity) async throws {
        _ = try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            try connection.prepared(
                "instance_beat",
                """
                INSERT INTO metricsd_instances (instance_id, host, pid, build_version, formula_version, listen,
                                                started_at, last_seen_at)
                VALUES ($1, $2, $3, $4, $5, $6, now(), now())
                ON CONFLICT (instance_id) DO UPDATE SET last_seen_at = now(), stopped_at = NULL, listen = excluded.listen
                """,
                [identity.id, identity.host, String(identity.pid), identity.buildVersion, String(identity.formulaVersion),
                 identity.listen])
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
