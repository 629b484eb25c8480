internal import CLibPQ
import Glibc

/// How to reach PostgreSQL: a libpq connection string or URI, plus the few defaults metricsd adds.
///
/// An empty `conninfo` means libpq's own defaults and the `PG*` environment (`PGHOST`, `PGSERVICE`,
/// `PGSSLMODE`, `.pgpass` …) exactly as psql would use them. metricsd only adds `application_name=metricsd`,
/// `connect_timeout=5`, TCP keepalives, `tcp_user_timeout=30000` and `options=-c jit=off`, each placed *before* the
/// connection string so that anything the operator wrote wins, and each left out when its `PG*` variable is set.
///
/// Nothing waits forever on the server: connecting gives up after `connect_timeout` (per host of a multi-host
/// string), a dead peer is noticed by keepalives and `tcp_user_timeout`, and every statement has a client-side
/// deadline (`statementDeadlineSeconds`): a statement without an answer by then is cancelled and its connection
/// dropped. That last one also covers a `COMMIT` that waits for a synchronous standby that is not there (a promoted
/// standby that inherited `synchronous_standby_names`), which neither `statement_timeout` nor keepalives end.
public struct ConnectionSettings: Sendable {
    public let conninfo: String
    /// How long one statement may go without an answer before it is cancelled and the connection dropped
    /// (nil, the default here: no limit). The daemon and CLI set `METRICSD_DB_STATEMENT_DEADLINE_SECONDS` (30 s);
    /// migrations lift it for their own statements.
    public var statementDeadlineSeconds: Double?
    /// Password from a systemd credential (`$CREDENTIALS_DIRECTORY/db-password`); overrides the string's.
    public let password: String?
    let defaults: [(String, String)]

    /// Validates the connection string with libpq's own parser; a malformed one throws `.badConnectionString`.
    public init(conninfo: String, password: String? = nil, environment: [String: String]) throws(PostgresError) {
        if !conninfo.isEmpty {
            var errorMessage: UnsafeMutablePointer<CChar>?
            if let options = PQconninfoParse(conninfo, &errorMessage) {
                defer { PQconninfoFree(options) }
                var option = options
                while let keyword = option.pointee.keyword {
                    if let value = option.pointee.val {
                        try Self.check(keyword: String(cString: keyword), value: String(cString: value))
                    }
                    option = option.advanced(by: 1)
                }
            } else {
                let message = errorMessage.map { String(cString: $0) } ?? "out of memory"
                PQfreemem(errorMessage)
                throw PostgresError(code: .badConnectionString, message: "DATABASE_URL is not valid: \(message)")
            }
        }
        var defaults: [(String, String)] = []
        if environment["PGAPPNAME"] == nil { defaults.append(("application_name", "metricsd")) }
        if environment["PGCONNECT_TIMEOUT"] == nil { defaults.append(("connect_timeout", "5")) }
        defaults += [("keepalives", "1"), ("keepalives_idle", "30"), ("keepalives_interval", "10"), ("keepalives_count", "3")]
        // Data sent but not acknowledged for 30 s (a peer that vanished mid-statement): the connection is dead.
        defaults.append(("tcp_user_timeout", "30000"))
        // No JIT on metricsd's sessions: its statements are short, but the planner's estimate for the enqueue
        // statement (thousands of zones × dates) is high enough that PostgreSQL JIT-compiles it on every tick,
        // ~1–1.7 s of CPU for ~0.25 s of work. An `options` in the string or PGOPTIONS replaces this.
        if environment["PGOPTIONS"] == nil { defaults.append(("options", "-c jit=off")) }
        self.conninfo = conninfo
        self.password = password
        self.defaults = defaults
    }

    /// Values libpq would only reject when connecting: checked up front so that a typo is a configuration error
    /// (one clear line, exit) instead of an endless "waiting for database".
    private static func check(keyword: String, value: String) throws(PostgresError) {
        func fail(_ expected: String) -> PostgresError {
            PostgresError(
                code: .badConnectionString, message: "DATABASE_URL is not valid: \(keyword) '\(value)' is not \(expected)")
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

    /// The keywords and values handed to `PQconnectdbParams` with `expand_dbname = 1`: defaults, then the
    /// operator's string (expanded in place of `dbname`), then the credential password.
    var parameters: [(String, String)] {
        var parameters = self.defaults
        parameters.append(("dbname", self.conninfo))
        if let password { parameters.append(("password", password)) }
        return parameters
    }
}

/// One libpq connection. Not thread-safe: the pool hands it to one thread-pool job at a time.
public final class PostgresConnection: @unchecked Sendable {  // exclusive use is enforced by PostgresPool
    private let handle: OpaquePointer
    private var preparedNames: Set<String> = []
    /// Set once the connection has failed in a way that makes it unusable.
    public private(set) var isBroken = false
    /// When the session was opened (the pool recycles sessions older than its `maxSessionAge`).
    public let openedAt = ContinuousClock.now
    /// The client-side limit for one statement (see `ConnectionSettings.statementDeadlineSeconds`).
    public var statementDeadlineSeconds: Double?

    /// Opens a connection (blocking; call from a thread-pool thread).
    public init(settings: ConnectionSettings) throws(PostgresError) {
        let parameters = settings.parameters
        let handle = Self.withCStrings(parameters.map(\.0)) { keywords in
            Self.withCStrings(parameters.map(\.1)) { values in
                PQconnectdbParams(keywords, values, 1)
            }
        }
        guard let handle else { throw PostgresError(code: .connectionFailed, message: "out of memory") }
        guard PQstatus(handle) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(handle))
            PQfinish(handle)
            // "too many clients" and "starting up" arrive here as text only: keep the SQLSTATE-like hint.
            throw PostgresError(code: .connectionFailed, message: message)
        }
        // Server notices ("relation … already exists, skipping") would go to stderr: drop them.
        PQsetNoticeProcessor(handle, { _, _ in }, nil)
        self.handle = handle
        self.statementDeadlineSeconds = settings.statementDeadlineSeconds
        // A read-only server (a hot standby, or one set to default_transaction_read_only) cannot do metricsd's work:
        // refuse it here rather than fail every write on it. libpq already skips such hosts with
        // target_session_attrs=read-write; this also covers one-host strings and poolers that route to a standby.
        if let reason = try self.readOnlyReason() {
            self.isBroken = true
            throw PostgresError(
                code: .connectionFailed,
                message: "the server is read-only (\(reason)); metricsd needs the primary: list every host with target_session_attrs=read-write")
        }
    }

    /// Why the server refuses writes on this session, or nil when it takes them. Uses the parameter status the
    /// server reports at start-up (`in_hot_standby`, PostgreSQL 14 and later; `default_transaction_read_only`),
    /// and asks `pg_is_in_recovery()` only of older servers.
    private func readOnlyReason() throws(PostgresError) -> String? {
        if let readOnly = PQparameterStatus(self.handle, "default_transaction_read_only"), String(cString: readOnly) == "on" {
            return "default_transaction_read_only is on"
        }
        if let standby = PQparameterStatus(self.handle, "in_hot_standby") {
            return String(cString: standby) == "on" ? "hot standby" : nil
        }
        return try self.query("SELECT pg_is_in_recovery()").string(0, 0) == "t" ? "hot standby" : nil
    }

    deinit { PQfinish(self.handle) }

    /// The server process serving this connection (`pg_backend_pid()`).
    public var backendPID: Int32 { PQbackendPID(self.handle) }

    /// True while libpq believes the connection is usable and the server takes writes on it.
    public var isHealthy: Bool {
        guard !self.isBroken, PQstatus(self.handle) == CONNECTION_OK else { return false }
        // Reported by the server whenever it changes (PostgreSQL 14 and later).
        if let standby = PQparameterStatus(self.handle, "in_hot_standby"), String(cString: standby) == "on" { return false }
        return true
    }

    /// Runs one statement with text parameters (`$1`, `$2` …; nil is SQL NULL). Values never enter the SQL text.
    @discardableResult
    public func query(_ sql: String, _ parameters: [String?] = []) throws(PostgresError) -> PostgresResult {
        let sent = Self.withOptionalCStrings(parameters) { values in
            PQsendQueryParams(self.handle, sql, Int32(parameters.count), nil, values, nil, nil, 0)
        }
        return try self.check(self.awaitResult(sent: sent))
    }

    /// Runs a statement through a named prepared statement, preparing it on first use on this connection.
    @discardableResult
    public func prepared(_ name: String, _ sql: String, _ parameters: [String?] = []) throws(PostgresError)
        -> PostgresResult
    {
        if !self.preparedNames.contains(name) {
            let sent = PQsendPrepare(self.handle, name, sql, Int32(parameters.count), nil)
            _ = try self.check(self.awaitResult(sent: sent))
            self.preparedNames.insert(name)
        }
        let sent = Self.withOptionalCStrings(parameters) { values in
            PQsendQueryPrepared(self.handle, name, Int32(parameters.count), values, nil, nil, 0)
        }
        return try self.check(self.awaitResult(sent: sent))
    }

    /// Runs statements without parameters (several separated by `;` are allowed): migrations, `BEGIN`, `LISTEN`.
    public func execute(_ sql: String) throws(PostgresError) {
        _ = try self.check(self.awaitResult(sent: PQsendQuery(self.handle, sql)))
    }

    /// Waits for the answer to the statement just sent, at most `statementDeadlineSeconds`, and returns what
    /// `PQexec` would: the first failed result, else the last one (nil when the connection failed). Past the
    /// deadline the statement is cancelled, the connection marked broken (the pool drops it) and
    /// `.connectionLost` thrown: the server may still finish it, so callers treat it as an unknown outcome,
    /// exactly like a connection cut mid-statement.
    private func awaitResult(sent: Int32) throws(PostgresError) -> OpaquePointer? {
        guard sent == 1 else { return nil }
        let deadline = self.statementDeadlineSeconds.map { Self.monotonicSeconds() + $0 }
        var kept: OpaquePointer?
        while true {
            while PQisBusy(self.handle) == 1 {
                let socket = PQsocket(self.handle)
                guard socket >= 0 else {
                    if let kept { PQclear(kept) }
                    return nil
                }
                var waitMilliseconds: Int32 = -1
                if let deadline {
                    let left = deadline - Self.monotonicSeconds()
                    if left <= 0 {
                        if let kept { PQclear(kept) }
                        self.abandon()
                        throw PostgresError(
                            code: .connectionLost,
                            message: "no answer from the database within \(Self.seconds(self.statementDeadlineSeconds ?? 0)) s; statement cancelled and connection dropped (a COMMIT waits forever when synchronous_standby_names names a standby that is not connected)",
                            sqlState: "57014")
                    }
                    waitMilliseconds = Int32(min(left * 1000 + 1, 60_000))
                }
                var poller = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
                let ready = poll(&poller, 1, waitMilliseconds)
                if ready < 0 && errno != EINTR {
                    if let kept { PQclear(kept) }
                    return nil
                }
                if ready > 0 && PQconsumeInput(self.handle) == 0 {
                    if let kept { PQclear(kept) }
                    return nil
                }
            }
            guard let result = PQgetResult(self.handle) else { return kept }
            if let previous = kept {
                let previousFailed = !Self.succeeded(previous)
                if previousFailed {
                    PQclear(result)
                    continue
                }
                PQclear(previous)
            }
            kept = result
        }
    }

    private static func succeeded(_ result: OpaquePointer) -> Bool {
        switch PQresultStatus(result) {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_EMPTY_QUERY: true
        default: false
        }
    }

    /// Gives up on the statement in flight: asks the server to cancel it (which also ends a wait for synchronous
    /// replication, leaving the transaction committed locally) and cuts the connection.
    private func abandon() {
        if let cancel = PQgetCancel(self.handle) {
            var buffer = [CChar](repeating: 0, count: 256)
            _ = PQcancel(cancel, &buffer, Int32(buffer.count))
            PQfreeCancel(cancel)
        }
        let socket = PQsocket(self.handle)
        if socket >= 0 { _ = shutdown(socket, Int32(SHUT_RDWR)) }
        self.isBroken = true
    }

    private static func monotonicSeconds() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }

    private static func seconds(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(value)
    }

    /// `BEGIN` … `COMMIT`, or `ROLLBACK` when `body` throws (the error is rethrown).
    public func transaction<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        try self.execute("BEGIN")
        do {
            let value = try body(self)
            try self.execute("COMMIT")
            return value
        } catch {
            if self.isHealthy { try? self.execute("ROLLBACK") }
            throw error
        }
    }

    /// Cuts the connection's socket without a goodbye, as a killed process would: the server rolls back the
    /// open transaction, and every later call fails as a lost connection. For crash-injection tests.
    public func simulateCrash() {
        let socket = PQsocket(self.handle)
        if socket >= 0 { _ = shutdown(socket, Int32(SHUT_RDWR)) }
        self.isBroken = true
    }

    // MARK: LISTEN / NOTIFY

    /// A notification received on a `LISTEN`ing connection.
    public struct Notification: Sendable {
        public let channel: String
        public let payload: String
    }

    /// Waits up to `timeoutMilliseconds` for notifications and returns those that arrived (maybe none).
    public func waitForNotifications(timeoutMilliseconds: Int32) throws(PostgresError) -> [Notification] {
        var notifications = self.drainNotifications()
        guard notifications.isEmpty else { return notifications }
        let socket = PQsocket(self.handle)
        guard socket >= 0 else {
            self.isBroken = true
            throw PostgresError(code: .connectionLost, message: "connection has no socket")
        }
        var poller = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        let ready = poll(&poller, 1, timeoutMilliseconds)
        if ready > 0 {
            guard PQconsumeInput(self.handle) == 1 else {
                self.isBroken = true
                throw PostgresError(code: .connectionLost, message: String(cString: PQerrorMessage(self.handle)))
            }
            notifications = self.drainNotifications()
        }
        if PQstatus(self.handle) != CONNECTION_OK {
            self.isBroken = true
            throw PostgresError(code: .connectionLost, message: String(cString: PQerrorMessage(self.handle)))
        }
        return notifications
    }

    private func drainNotifications() -> [Notification] {
        var notifications: [Notification] = []
        while let notify = PQnotifies(self.handle) {
            let channel = String(cString: notify.pointee.relname)
            let payload = String(cString: notify.pointee.extra)
            PQfreemem(notify)
            notifications.append(Notification(channel: channel, payload: payload))
        }
        return notifications
    }

    // MARK: Results and errors

    private func check(_ result: OpaquePointer?) throws(PostgresError) -> PostgresResult {
        guard let result else {
            self.isBroken = PQstatus(self.handle) != CONNECTION_OK
            throw PostgresError(
                code: self.isBroken ? .connectionLost : .queryFailed,
                message: String(cString: PQerrorMessage(self.handle)))
        }
        switch PQresultStatus(result) {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
            return PostgresResult(result)
        default:
            let sqlState = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            let primary = PQresultErrorField(result, Int32(UInt8(ascii: "M"))).map { String(cString: $0) }
            let message = primary ?? String(cString: PQresultErrorMessage(result))
            PQclear(result)
            // 25006 (read-only transaction): the server is, or became, a standby. The session can never write
            // again; treat it as lost so the pool drops it and a retry reconnects (libpq picks the primary).
            let lost = PQstatus(self.handle) != CONNECTION_OK || sqlState == "25006"
            if lost { self.isBroken = true }
            throw PostgresError(code: lost ? .connectionLost : .queryFailed, message: message, sqlState: sqlState)
        }
    }

    // MARK: C strings

    private static func withCStrings<R>(_ strings: [String], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        return body(copies.map { $0.map { UnsafePointer($0) } } + [nil])
    }

    private static func withOptionalCStrings<R>(_ strings: [String?], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
        let copies = strings.map { $0.map { strdup($0) } ?? nil }
        defer { copies.forEach { free($0) } }
        return body(copies.map { $0.map { UnsafePointer($0) } })
    }
}
