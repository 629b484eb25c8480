internal import CLibPQ
import Glibc
import MetricsdMasking

/// How to reach PostgreSQL: a libpq connection string or URI, plus the few defaults metricsd adds.
///
/// An empty `conninfo` means libpq's own defaults and the `PG*` environment (`PGHOST`, `PGSERVICE`,
/// `PGSSLMODE`, `.pgpass` …) exactly as psql would use them. metricsd only adds `application_name=metricsd`,
/// `connect_timeout=5`, TCP keepalives and `tcp_user_timeout=30000`, each placed *before* the connection string so
/// that anything the operator wrote wins, and each left out when its `PG*` variable is set. Nothing else goes into
/// the startup packet: a connection pooler (PgBouncer) refuses any startup parameter it does not track, such as
/// `options`, and with `ignore_startup_parameters` drops it silently. What metricsd needs of a session it sets per
/// transaction (`SET LOCAL`), which survives any pooler.
///
/// Nothing waits forever on the server: connecting gives up after `connect_timeout` (per host of a multi-host
/// string), a dead peer is noticed by keepalives and `tcp_user_timeout`, and every statement has a client-side
/// deadline (`statementDeadlineSeconds`): a statement without an answer by then is cancelled and its connection
/// dropped. That last one also covers a `COMMIT` that waits for a synchronous standby that is not there (a promoted
/// standby that inherited `synchronous_standby_names`), which neither `statement_timeout` nor keepalives end.
///
/// No password leaves through an error: ``mask`` knows every password this connection may use (written in the
/// string, the credential, `PGPASSWORD`), and every error made from libpq's text — the string refused here, a
/// connection refused later — goes through it, so every consumer (stderr, `STATUS=`, the log, `check-config`,
/// `/readyz`, API errors) gets `***` in its place.
public struct ConnectionSettings: Sendable {
    public let conninfo: String
    /// The setting the string came from (`DATABASE_URL`), to name it in errors.
    public let setting: String
    /// How long one statement may go without an answer before it is cancelled and the connection dropped
    /// (nil, the default here: no limit). The daemon and CLI set `METRICSD_DB_STATEMENT_DEADLINE_SECONDS` (30 s);
    /// migrations lift it for their own statements.
    public var statementDeadlineSeconds: Double?
    /// Password from a systemd credential (`$CREDENTIALS_DIRECTORY/db-password`); overrides the string's.
    public let password: String?
    /// Masks this connection's passwords in any text (every `PostgresError` this connection makes is masked).
    public let mask: SecretMask
    /// False (the default): a read-only server (a hot standby) is refused at connect and a session on a server
    /// that became one is dropped, as metricsd's writes need the primary. True for the read servers of
    /// `METRICSD_READ_DATABASE_URL` (``readServers()``), which are standbys on purpose.
    public private(set) var acceptsReadOnly = false
    /// When set, a connection gives up that many seconds after it started connecting, whatever `connect_timeout`
    /// says (``PostgresConnection``'s own wait: one host only). Set for read servers, whose bound is shorter.
    public var connectDeadlineSeconds: Double?
    /// libpq's `connect_timeout` for these settings, in seconds as libpq applies it (per host, at least 2); nil: no
    /// limit (0 or negative).
    public let connectTimeoutSeconds: Double?
    /// Named or unnamed prepared statements (`METRICSD_DB_PREPARED_STATEMENTS`); see ``StatementMode``.
    public var statementMode: StatementMode = .auto

    /// How ``PostgresConnection/prepared(_:_:_:)`` runs a statement.
    ///
    /// A named statement is prepared once per session and then only bound and executed: the cheapest, but it lives
    /// in the server session that prepared it. Through a transaction-mode pooler (PgBouncer before 1.21, or later
    /// without `max_prepared_statements`) each statement outside a transaction may run on another server session,
    /// where the name is missing (26000) or another client's (42P05). An unnamed statement is parsed, planned and
    /// executed in one message sequence ending in one Sync, which a pooler keeps on one server: it works through
    /// every pooler, at the cost of a parse and plan per statement.
    public enum StatementMode: String, Sendable, CaseIterable {
        /// Named statements always: a direct connection, HAProxy, PgBouncer in session mode, PgBouncer 1.21 and
        /// later with `max_prepared_statements` above 0.
        case named
        /// Unnamed statements always.
        case unnamed
        /// Named on a direct connection, unnamed when a pooler answers instead of PostgreSQL: a pooler answers the
        /// start-up with a cancel key of its own, so the process id libpq was given differs from
        /// `pg_backend_pid()` (a TCP proxy such as HAProxy passes the server's through, and stays named).
        case auto
    }
    let defaults: [(String, String)]

    /// Validates the connection string with libpq's own parser; a malformed one throws `.badConnectionString`,
    /// whose message names `setting` and never holds a password.
    public init(
        conninfo: String, password: String? = nil, environment: [String: String], setting: String = "DATABASE_URL"
    ) throws(PostgresError) {
        var mask = SecretMask(connectionString: conninfo, password: password, environment: environment)
        var connectTimeout = environment["PGCONNECT_TIMEOUT"] ?? "5"
        if !conninfo.isEmpty {
            let values = try Self.parse(conninfo, setting: setting, mask: mask)
            if let written = values.last(where: { $0.0 == "connect_timeout" }) { connectTimeout = written.1 }
            // libpq's own reading of the password (decoded), besides the one found in the text.
            for (keyword, value) in values where keyword == "password" { mask.add(value) }
            for (keyword, value) in values {
                try Self.check(keyword: keyword, value: value, setting: setting, mask: mask)
            }
        }
        var defaults: [(String, String)] = []
        if environment["PGAPPNAME"] == nil { defaults.append(("application_name", "metricsd")) }
        if environment["PGCONNECT_TIMEOUT"] == nil { defaults.append(("connect_timeout", "5")) }
        defaults += [
            ("keepalives", "1"), ("keepalives_idle", "30"), ("keepalives_interval", "10"), ("keepalives_count", "3"),
        ]
        // Data sent but not acknowledged for 30 s (a peer that vanished mid-statement): the connection is dead.
        defaults.append(("tcp_user_timeout", "30000"))
        self.conninfo = conninfo
        self.setting = setting
        self.password = password
        self.mask = mask
        self.defaults = defaults
        // libpq reads it with atoi (a typo is refused above) and waits at least 2 s per host.
        let timeout = Int(connectTimeout) ?? 0
        self.connectTimeoutSeconds = timeout > 0 ? Double(max(2, timeout)) : nil
    }

    private init(copying base: ConnectionSettings, conninfo: String) {
        self.conninfo = conninfo
        self.setting = base.setting
        self.statementDeadlineSeconds = base.statementDeadlineSeconds
        self.password = base.password
        self.mask = base.mask
        self.acceptsReadOnly = base.acceptsReadOnly
        self.connectDeadlineSeconds = base.connectDeadlineSeconds
        self.connectTimeoutSeconds = base.connectTimeoutSeconds
        self.statementMode = base.statementMode
        self.defaults = base.defaults
    }

    /// One server of a read URL: its label (`host:port`, for logs, `/metrics` and `metricsd status`) and how to
    /// reach it alone.
    public struct ReadServer: Sendable {
        public let label: String
        public let settings: ConnectionSettings
        /// The URL asks for standbys (`target_session_attrs=standby` or `prefer-standby`): a server that is not in
        /// recovery is never read from, not even the primary itself (whose share goes through `DATABASE_URL`).
        public let standbysOnly: Bool
    }

    /// The servers of this string, one per host (a multi-host URL lists several), each reached on its own and
    /// accepting read-only servers: libpq 15 connects to the first host that answers and has no
    /// `load_balance_hosts` (PostgreSQL 16), so metricsd keeps the list and spreads reads over it itself. Every
    /// other parameter (user, database, TLS, timeouts) applies to each host. `target_session_attrs=standby` and
    /// `prefer-standby` become ``ReadServer/standbysOnly`` and are not passed to libpq: libpq checks them only when
    /// connecting, so a server promoted later would keep its sessions, and one refused at connect would show as
    /// unreachable; metricsd checks the role at every probe instead, and says why it leaves a primary.
    public func readServers() throws(PostgresError) -> [ReadServer] {
        let values = try Self.parse(self.conninfo, setting: self.setting, mask: self.mask)
        let attributes = values.last { $0.0 == "target_session_attrs" }?.1
        let standbysOnly = attributes == "standby" || attributes == "prefer-standby"
        func list(_ keyword: String) -> [String] {
            values.last { $0.0 == keyword }.map {
                $0.1.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
            } ?? []
        }
        let (hosts, addresses, ports) = (list("host"), list("hostaddr"), list("port"))
        let count = max(1, hosts.count, addresses.count)
        // One check per keyword, not a loop over an array of (keyword, count) pairs: Swift 6.3 compiled that loop
        // into one of two instruction orders from build to build (see debian/rules, "the compiler itself").
        try self.checkValueCount(of: "host", found: hosts.count, hosts: count)
        try self.checkValueCount(of: "hostaddr", found: addresses.count, hosts: count)
        try self.checkValueCount(of: "port", found: ports.count, hosts: count)
        let others = values.filter {
            !["host", "hostaddr", "port"].contains($0.0) && !(standbysOnly && $0.0 == "target_session_attrs")
        }
        var servers: [ReadServer] = []
        for index in 0..<count {
            func pick(_ list: [String]) -> String? {
                let value = list.count == 1 ? list[0] : (index < list.count ? list[index] : "")
                return value.isEmpty ? nil : value
            }
            var own = others
            if let host = pick(hosts) { own.append(("host", host)) }
            if let address = pick(addresses) { own.append(("hostaddr", address)) }
            if let port = pick(ports) { own.append(("port", port)) }
            let name = pick(hosts) ?? pick(addresses) ?? "default host"
            var settings = ConnectionSettings(
                copying: self, conninfo: own.map { "\($0.0)=\(Self.quoted($0.1))" }.joined(separator: " "))
            settings.acceptsReadOnly = true
            servers.append(
                ReadServer(label: "\(name):\(pick(ports) ?? "5432")", settings: settings, standbysOnly: standbysOnly))
        }
        return servers
    }

    /// A multi-host keyword gives one value for all hosts or one per host.
    private func checkValueCount(of keyword: String, found: Int, hosts count: Int) throws(PostgresError) {
        guard found > 1 && found != count else { return }
        throw PostgresError(
            code: .badConnectionString,
            message: "\(self.setting) is not valid: \(found) values of \(keyword) for \(count) hosts", mask: self.mask)
    }

    /// The keywords and values `conninfo` sets, as libpq's own parser reads them; a malformed string throws
    /// `.badConnectionString` naming `setting`, masked with `mask`.
    private static func parse(_ conninfo: String, setting: String, mask: SecretMask) throws(PostgresError) -> [(
        String, String
    )] {
        var errorMessage: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(conninfo, &errorMessage) else {
            let message = errorMessage.map { String(cString: $0) } ?? "out of memory"
            PQfreemem(errorMessage)
            throw PostgresError(code: .badConnectionString, message: "\(setting) is not valid: \(message)", mask: mask)
        }
        defer { PQconninfoFree(options) }
        var values: [(String, String)] = []
        var option = options
        while let keyword = option.pointee.keyword {
            if let value = option.pointee.val { values.append((String(cString: keyword), String(cString: value))) }
            option = option.advanced(by: 1)
        }
        return values
    }

    /// A value in libpq's `keyword=value` syntax: single-quoted, with `\` and `'` escaped.
    private static func quoted(_ value: String) -> String {
        "'" + value.replacing("\\", with: "\\\\").replacing("'", with: "\\'") + "'"
    }

    /// Values libpq would only reject when connecting: checked up front so that a typo is a configuration error
    /// (one clear line, exit) instead of an endless "waiting for database".
    private static func check(keyword: String, value: String, setting: String, mask: SecretMask) throws(PostgresError) {
        func fail(_ expected: String) -> PostgresError {
            PostgresError(
                code: .badConnectionString,
                message: "\(setting) is not valid: \(keyword) '\(value)' is not \(expected)",
                mask: mask)
        }
        switch keyword {
        case "port":
            let ports = value.split(separator: ",", omittingEmptySubsequences: false)
            guard ports.allSatisfy({ $0.isEmpty || (Int($0).map { (1...65535).contains($0) } ?? false) }) else {
                throw fail("a port number (1–65535)")
            }
        case "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
            "tcp_user_timeout":
            guard Int(value) != nil else { throw fail("an integer") }
        case "sslmode":
            guard ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"].contains(value) else {
                throw fail("one of disable, allow, prefer, require, verify-ca, verify-full")
            }
        case "target_session_attrs":
            guard ["any", "read-write", "read-only", "primary", "standby", "prefer-standby"].contains(value) else {
                throw fail("one of any, read-write, read-only, primary, standby, prefer-standby")
            }
        default:
            break
        }
    }

    /// Whether the string (or `PGOPTIONS`) sets `options`: a startup parameter a connection pooler refuses.
    public func setsStartupOptions(environment: [String: String]) -> Bool {
        if let options = environment["PGOPTIONS"], !options.isEmpty { return true }
        let values = (try? Self.parse(self.conninfo, setting: self.setting, mask: self.mask)) ?? []
        return values.contains { $0.0 == "options" && !$0.1.isEmpty }
    }

    /// The keywords and values handed to `PQconnectdbParams` with `expand_dbname = 1`: defaults, then the
    /// operator's string (expanded in place of `dbname`), then the credential password.
    var parameters: [(String, String)] {
        var parameters = self.defaults
        parameters.append(("dbname", self.conninfo))
        if let password { parameters.append(("password", password)) }
        return parameters
    }
}
