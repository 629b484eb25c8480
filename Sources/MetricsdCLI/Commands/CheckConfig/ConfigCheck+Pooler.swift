import MetricsdConfiguration
import MetricsdPostgres

extension ConfigCheck {
    /// What a connection pooler in front of `DATABASE_URL` means for metricsd: whether one answers (its cancel key
    /// differs from `pg_backend_pid()`), whether it shares server sessions between clients (transaction pooling: a
    /// server one client released is handed to the next), and whether it carries named prepared statements across
    /// them (PgBouncer 1.21 and later with `max_prepared_statements`). A setting that cannot work through it is a
    /// problem naming what to change; polling for lack of a notification URL is a warning.
    mutating func checkPooler(_ database: DatabaseSettings, environment: [String: String]) async {
        guard !self.problems.contains(where: { $0.setting == "DATABASE_URL" }) else { return }
        guard var settings = try? database.primary(environment: environment) else { return }
        let mode = database.statementMode
        settings.statementMode = .named
        let probe = settings
        let result = await Task.detached { Result { () throws(PostgresError) in try Self.poolerFacts(probe) } }.value
        guard case .success(let facts) = result, facts.pooled else {
            if case .success = result { self.note("pooler", "none (a direct connection): named prepared statements") }
            return
        }
        let sharing =
            facts.sharesServers
            ? "shares server sessions between clients (transaction pooling)"
            : "keeps a server session per client (session pooling)"
        let named =
            facts.sharesServers
            ? (facts.carriesNamed
                ? "carries named statements across them" : "does not carry named statements across them") : ""
        self.note(
            "pooler",
            "a connection pooler answers for DATABASE_URL; it \(sharing)\(named.isEmpty ? "" : "; it " + named)")
        if mode == .named && facts.sharesServers && !facts.carriesNamed {
            self.problem(
                "METRICSD_DB_PREPARED_STATEMENTS", ConfigurationError.Kind.invalidValue,
                "named prepared statements fail through this pooler (another client's server session runs them: SQLSTATE 26000/42P05): set METRICSD_DB_PREPARED_STATEMENTS=auto or unnamed, or max_prepared_statements = 200 in PgBouncer 1.21 or later"
            )
        }
        if settings.setsStartupOptions(environment: environment) {
            self.problem(
                "DATABASE_URL", ConfigurationError.Kind.invalidValue,
                "options (in DATABASE_URL or PGOPTIONS) goes through a pooler, which refuses it or, with ignore_startup_parameters, drops it silently: remove it and set what it set on the role instead (ALTER ROLE … SET …)"
            )
        }
        if database.notifyURL == nil {
            self.warn(
                "METRICSD_NOTIFY_DATABASE_URL",
                "not set while DATABASE_URL goes through a pooler: the daemon does not LISTEN and polls for settings changes every METRICSD_IDLE_POLL_SECONDS; set it to the primary itself (or HAProxy's primary port, or a session-mode pool) for changes within a second"
            )
        }
    }

    struct PoolerFacts {
        var pooled = false
        var sharesServers = false
        var carriesNamed = false
    }

    /// Asks through two sessions: A runs a statement and releases its server; B, in a transaction, gets the server
    /// most recently released (PgBouncer's default), A's when the pooler shares them. Tried a few times, as other
    /// clients may take that server in between. Then A prepares a named statement, B holds A's server in a
    /// transaction, and A runs the statement on another one.
    static func poolerFacts(_ settings: ConnectionSettings) throws(PostgresError) -> PoolerFacts {
        var facts = PoolerFacts()
        let first = try PostgresConnection(settings: settings)
        facts.pooled = first.isPooled
        guard facts.pooled else { return facts }
        let second = try PostgresConnection(settings: settings)
        for _ in 0..<5 where !facts.sharesServers {
            let released = try first.query("SELECT pg_backend_pid()").int(0, 0)
            try second.execute("BEGIN")
            let taken = try second.query("SELECT pg_backend_pid()").int(0, 0)
            try second.execute("COMMIT")
            facts.sharesServers = released == taken
        }
        guard facts.sharesServers else { return facts }
        let name = "metricsd_check_" + String(UInt32.random(in: 1...UInt32.max), radix: 16)
        try first.prepared(name, "SELECT 1")
        try second.execute("BEGIN; SELECT 1")
        defer { try? second.execute("COMMIT") }
        facts.carriesNamed = (try? first.prepared(name, "SELECT 1")) != nil
        return facts
    }
}
