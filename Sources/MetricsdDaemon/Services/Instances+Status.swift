import HealthMetrics
import MetricsdPostgres
import MetricsdReads
import MetricsdWork

/// The heartbeat rows as `metricsd status` shows them: the instances and what their latest reads see of their read
/// servers.
extension StatusQueries {
    /// A heartbeat row.
    public struct InstanceStatus: Sendable, Equatable {
        public let id: String
        public let host: String
        public let pid: Int
        public let buildVersion: String
        public let formulaVersion: Int
        public let listen: String
        public let startedAt: Timestamp
        public let lastSeenAt: Timestamp
        public let stoppedAt: Timestamp?
        /// Seen in the last minute and not stopped.
        public let alive: Bool
    }

    /// What a live instance's latest reads see of one read server (its last heartbeat).
    public struct ReadServerStatus: Sendable, Equatable {
        public let instance: String
        public let status: ReadReplicas.ServerStatus
        public let updatedAt: Timestamp
    }

    /// The read servers of the live instances (those with `METRICSD_READ_DATABASE_URL`), by instance and server.
    public func readServers() async throws -> [ReadServerStatus] {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.query(
                """
                SELECT r.instance_id, r.server, r.usable, r.lag_seconds::text, r.reads, r.problem,
                       (extract(epoch FROM r.updated_at) * 1000)::bigint
                FROM metricsd_read_servers r JOIN metricsd_instances i USING (instance_id)
                WHERE i.stopped_at IS NULL AND i.last_seen_at > now() - interval '1 minute'
                ORDER BY r.instance_id, r.server = 'primary', r.server
                """)
            return try (0..<result.rowCount).map { row in
                ReadServerStatus(
                    instance: try result.requiredString(row, 0),
                    status: ReadReplicas.ServerStatus(
                        server: try result.requiredString(row, 1), usable: try result.bool(row, 2),
                        lagSeconds: result.string(row, 3).flatMap(Double.init), reads: Int(try result.int(row, 4)),
                        problem: result.string(row, 5)),
                    updatedAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 6)))
            }
        }
    }

    /// Instances seen in the last day, alive first.
    public func instances() async throws -> [InstanceStatus] {
        try await self.pool.withConnection(retryOnConnectionLoss: true) { connection in
            let result = try connection.query(
                """
                SELECT instance_id, host, pid, build_version, formula_version, listen,
                       (extract(epoch FROM started_at) * 1000)::bigint, (extract(epoch FROM last_seen_at) * 1000)::bigint,
                       (extract(epoch FROM stopped_at) * 1000)::bigint,
                       stopped_at IS NULL AND last_seen_at > now() - interval '1 minute'
                FROM metricsd_instances WHERE last_seen_at > now() - interval '1 day'
                ORDER BY 10 DESC, last_seen_at DESC
                """)
            return try (0..<result.rowCount).map { row in
                InstanceStatus(
                    id: try result.requiredString(row, 0), host: try result.requiredString(row, 1),
                    pid: Int(try result.int(row, 2)), buildVersion: try result.requiredString(row, 3),
                    formulaVersion: Int(try result.int(row, 4)), listen: try result.requiredString(row, 5),
                    startedAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 6)),
                    lastSeenAt: Timestamp(millisecondsSinceEpoch: try result.int(row, 7)),
                    stoppedAt: try result.optionalInt(row, 8).map { Timestamp(millisecondsSinceEpoch: $0) },
                    alive: try result.bool(row, 9))
            }
        }
    }
}
