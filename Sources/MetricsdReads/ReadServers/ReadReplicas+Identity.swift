import MetricsdPostgres

extension ReadReplicas {
    /// Who a server is, as far as following a primary goes: read by the monitor from the primary at every sample
    /// and from each read server at every probe.
    ///
    /// Freshness alone compares WAL positions, which mean something only along one history: a separate cluster, a
    /// standby promoted on its own or an old primary after a failover can stand at a higher position than the
    /// primary and look current while serving other data. So a read server must also have the primary's system
    /// identifier (`pg_control_system()`: set by initdb, carried by every copy made from it) and, when it is a
    /// standby, the primary's timeline (each promotion starts a new one; a standby that follows the primary receives
    /// it). A server that is not in recovery follows no one: it is read from only when it is the primary itself.
    struct Identity: Equatable, Sendable {
        let systemIdentifier: String
        /// A primary: the timeline it writes (its current WAL file's). A standby: the timeline it last received WAL
        /// on (`pg_stat_wal_receiver.received_tli`), or, when that is not visible to the role (it takes
        /// `pg_read_all_stats`) or no WAL receiver runs, the timeline of its last restartpoint.
        let timeline: Int
        /// `pg_postmaster_start_time()` in epoch seconds, to the microsecond.
        let startedAt: String
    }

    /// `SELECT`-list items giving an ``Identity``: system identifier, timeline (a number), start time.
    static let identityColumns = """
        (SELECT system_identifier FROM pg_control_system())::text,
        (CASE WHEN pg_is_in_recovery()
              THEN coalesce((SELECT nullif(received_tli, 0) FROM pg_stat_wal_receiver),
                            (SELECT timeline_id FROM pg_control_checkpoint()))::bigint
              ELSE ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint END)::text,
        extract(epoch FROM pg_postmaster_start_time())::text
        """

    /// The ``Identity`` in `result`'s first row from `column` on (``identityColumns``).
    static func identity(_ result: PostgresResult, from column: Int) throws -> Identity {
        let timelineText = try result.requiredString(0, column + 1)
        guard let timeline = Int(timelineText) else {
            throw PostgresError(code: .unexpectedResult, message: "timeline \(timelineText) is not a number")
        }
        return Identity(
            systemIdentifier: try result.requiredString(0, column), timeline: timeline,
            startedAt: try result.requiredString(0, column + 2))
    }

    /// Why the server on `server` does not follow the primary on `primary` (nil when it does), as the daemon
    /// decides it: for `metricsd check-config`.
    public static func mismatch(of server: PostgresConnection, primary: PostgresConnection, standbysOnly: Bool) throws
        -> String?
    {
        let query = "SELECT pg_is_in_recovery(), \(Self.identityColumns)"
        let observed = try server.query(query)
        let reference = try primary.query(query)
        return Self.mismatch(
            observed: try Self.identity(observed, from: 1), inRecovery: try observed.bool(0, 0),
            standbysOnly: standbysOnly,
            primary: try Self.identity(reference, from: 1))?.detail
    }

    /// Why a server that is `observed` (in recovery or not) does not follow `primary`, or nil when it does (or the
    /// primary is not known yet: then no server can be shown to be fresh either).
    ///
    /// How a server not in recovery is told to be the primary itself: same system identifier, same timeline *and*
    /// the same postmaster start time. The address it answers on (`inet_server_addr()`, `inet_server_port()`)
    /// cannot tell: behind HAProxy, PgBouncer or NAT, and for a host with several addresses, the primary's pool and
    /// the read server see other addresses of one server. System identifier and timeline alone cannot either: two
    /// standbys of one primary promoted apart (one by a failover manager, one by mistake) both take the next
    /// timeline. The start time, to the microsecond, belongs to one running server; when the primary restarts, both
    /// sides read the new one at their next probe.
    static func mismatch(
        observed: Identity, inRecovery: Bool, standbysOnly: Bool, primary: Identity?
    ) -> (problem: Problem, detail: String)? {
        guard let primary else { return nil }
        if observed.systemIdentifier != primary.systemIdentifier {
            return (
                .otherCluster,
                "another cluster: system identifier \(observed.systemIdentifier), the primary's \(primary.systemIdentifier)"
            )
        }
        if inRecovery {
            guard observed.timeline != primary.timeline else { return nil }
            return (
                .otherTimeline,
                "a standby on timeline \(observed.timeline), the primary on timeline \(primary.timeline): it does not follow the primary"
            )
        }
        guard observed == primary else {
            return (
                .otherPrimary,
                "a primary that is not DATABASE_URL's (promoted on its own, or an old primary; timeline \(observed.timeline), the primary's \(primary.timeline))"
            )
        }
        guard standbysOnly else { return nil }
        return (
            .primaryNotWanted,
            "the primary itself; target_session_attrs asks for standbys (the primary's reads go through DATABASE_URL)"
        )
    }
}
