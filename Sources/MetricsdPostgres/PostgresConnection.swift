internal import CLibPQ
import Glibc
import MetricsdMasking
import MetricsdTracing
import Tracing

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
    /// The passwords this connection was given: masked in every error it makes from libpq's text.
    private let mask: SecretMask
    /// A read server's session (`ConnectionSettings.acceptsReadOnly`): a hot standby is what it wants.
    private let acceptsReadOnly: Bool
    /// A connection pooler answers for the server: the process id libpq got at start-up is not the server
    /// process's (`pg_backend_pid()`). Each statement outside a transaction may then run in another server session.
    public private(set) var isPooled = false
    /// Whether ``prepared(_:_:_:)`` uses named statements (``ConnectionSettings/StatementMode``).
    public private(set) var usesNamedStatements = true
    /// What this connection was opened with (another session to the same place is opened from it).
    public let settings: ConnectionSettings
    /// The span the statements run now belong to (their spans are its children; ``StatementTrace``); nil: no
    /// statement span. Set by the pool for the length of a caller's work, by the batched read for each batch.
    public var trace: StatementTrace?
    /// The database's name (`db.namespace` of the statement spans).
    private lazy var databaseName: String = PQdb(self.handle).map { String(cString: $0) } ?? ""

    /// Opens a connection (blocking; call from a thread-pool thread): within `settings.connectDeadlineSeconds` when
    /// set, else as libpq does (`connect_timeout` per host).
    public init(settings: ConnectionSettings) throws(PostgresError) {
        let parameters = settings.parameters
        let handle = try Self.withCStrings(parameters.map(\.0)) { (keywords) throws(PostgresError) in
            try Self.withCStrings(parameters.map(\.1)) { (values) throws(PostgresError) in
                if let deadline = settings.connectDeadlineSeconds {
                    return try Self.connect(keywords, values, within: deadline, mask: settings.mask)
                }
                return PQconnectdbParams(keywords, values, 1)
            }
        }
        guard let handle else { throw PostgresError(code: .connectionFailed, message: "out of memory") }
        guard PQstatus(handle) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(handle))
            PQfinish(handle)
            // "too many clients" and "starting up" arrive here as text only: keep the SQLSTATE-like hint. libpq
            // quotes host names, which a password with an unescaped "@" becomes part of: masked.
            throw PostgresError(code: .connectionFailed, message: message, mask: settings.mask)
        }
        // Server notices ("relation … already exists, skipping") would go to stderr: drop them.
        PQsetNoticeProcessor(handle, { _, _ in }, nil)
        self.handle = handle
        self.settings = settings
        self.mask = settings.mask
        self.statementDeadlineSeconds = settings.statementDeadlineSeconds
        self.acceptsReadOnly = settings.acceptsReadOnly
        self.isPooled = try self.query("SELECT pg_backend_pid()").int(0, 0) != Int64(PQbackendPID(handle))
        switch settings.statementMode {
        case .named: self.usesNamedStatements = true
        case .unnamed: self.usesNamedStatements = false
        case .auto: self.usesNamedStatements = !self.isPooled
        }
        if settings.acceptsReadOnly { return }
        // A read-only server (a hot standby, or one set to default_transaction_read_only) cannot do metricsd's work:
        // refuse it here rather than fail every write on it. libpq already skips such hosts with
        // target_session_attrs=read-write; this also covers one-host strings and poolers that route to a standby.
        if let reason = try self.readOnlyReason() {
            self.isBroken = true
            throw PostgresError(
                code: .connectionFailed,
                message:
                    "the server is read-only (\(reason)); metricsd needs the primary: list every host with target_session_attrs=read-write"
            )
        }
    }

    /// Connects without blocking (`PQconnectStartParams`, `PQconnectPoll`) and gives up `seconds` after starting:
    /// `PQconnectdbParams` waits `connect_timeout` per host (whole seconds, at least 2), which a server that accepts
    /// TCP and never answers takes in full, longer than a read bound of a second or two. Only for settings naming
    /// one host: libpq moves to a multi-host string's next host after *its* timeout, which this loop cannot ask for.
    /// (Resolving a host name still blocks, as in libpq.) Returns the connection (its status tells whether it
    /// succeeded) or nil when out of memory.
    private static func connect(
        _ keywords: [UnsafePointer<CChar>?], _ values: [UnsafePointer<CChar>?], within seconds: Double, mask: SecretMask
    ) throws(PostgresError) -> OpaquePointer? {
        let deadline = Self.monotonicSeconds() + seconds
        guard let handle = PQconnectStartParams(keywords, values, 1) else { return nil }
        var polling = PGRES_POLLING_WRITING
        while PQstatus(handle) != CONNECTION_BAD && polling != PGRES_POLLING_OK && polling != PGRES_POLLING_FAILED {
            let left = deadline - Self.monotonicSeconds()
            guard left > 0 else {
                PQfinish(handle)
                throw PostgresError(
                    code: .connectionFailed,
                    message: "no answer from the database within \(Self.seconds(seconds)) s while connecting",
                    mask: mask)
            }
            var poller = pollfd(
                fd: PQsocket(handle), events: Int16(polling == PGRES_POLLING_READING ? POLLIN : POLLOUT), revents: 0)
            let ready = poll(&poller, 1, Int32(min(left * 1000 + 1, 60_000)))
            if ready < 0 && errno != EINTR { break }
            if ready > 0 { polling = PQconnectPoll(handle) }
        }
        return handle
    }

    /// Why the server refuses writes on this session, or nil when it takes them. Uses the parameter status the
    /// server reports at start-up (`in_hot_standby`, PostgreSQL 14 and later; `default_transaction_read_only`),
    /// and asks `pg_is_in_recovery()` only of older servers.
    private func readOnlyReason() throws(PostgresError) -> String? {
        if let readOnly = PQparameterStatus(self.handle, "default_transaction_read_only"),
            String(cString: readOnly) == "on"
        {
            return "default_transaction_read_only is on"
        }
        if let standby = PQparameterStatus(self.handle, "in_hot_standby") {
            return String(cString: standby) == "on" ? "hot standby" : nil
        }
        return try self.query("SELECT pg_is_in_recovery()").string(0, 0) == "t" ? "hot standby" : nil
    }

    deinit { PQfinish(self.handle) }

    /// The process id libpq was given at start-up: the server process's on a direct connection, a pooler's own
    /// number through a pooler.
    public var backendPID: Int32 { PQbackendPID(self.handle) }

    /// True while libpq believes the connection is usable and the server takes writes on it (a read server's: is
    /// usable).
    public var isHealthy: Bool {
        guard !self.isBroken, PQstatus(self.handle) == CONNECTION_OK else { return false }
        if self.acceptsReadOnly { return true }
        // Reported by the server whenever it changes (PostgreSQL 14 and later).
        if let standby = PQparameterStatus(self.handle, "in_hot_standby"), String(cString: standby) == "on" {
            return false
        }
        return true
    }

    /// Runs one statement with text parameters (`$1`, `$2` …; nil is SQL NULL). Values never enter the SQL text.
    /// An unnamed statement: Parse, Bind, Describe, Execute and one Sync go out together, so a pooler runs them in
    /// one server session (never split them over two Syncs: through a pooler the second part could run another
    /// client's unnamed statement).
    @discardableResult
    public func query(_ sql: String, _ parameters: [String?] = []) throws(PostgresError) -> PostgresResult {
        try self.traced(StatementTrace.summary(of: sql)) { (comment) throws(PostgresError) in
            try self.unnamed(comment.map { $0 + sql } ?? sql, parameters)
        }
    }

    private func unnamed(_ sql: String, _ parameters: [String?]) throws(PostgresError) -> PostgresResult {
        let sent = Self.withOptionalCStrings(parameters) { values in
            PQsendQueryParams(self.handle, sql, Int32(parameters.count), nil, values, nil, nil, 0)
        }
        return try self.check(self.awaitResult(sent: sent))
    }

    /// Runs a statement through a named prepared statement, preparing it on first use on this connection; when
    /// the connection uses unnamed statements, as ``query(_:_:)`` does (the name is then unused).
    @discardableResult
    public func prepared(_ name: String, _ sql: String, _ parameters: [String?] = []) throws(PostgresError)
        -> PostgresResult
    {
        try self.traced(name) { (comment) throws(PostgresError) in
            // A statement with the comment has a text unlike every other's: sent unnamed, the prepared one stays
            // as it is. (The batched latest read never gets one: ``StatementTrace/Comment/never``.)
            guard self.usesNamedStatements, comment == nil else {
                return try self.unnamed(comment.map { $0 + sql } ?? sql, parameters)
            }
            return try self.named(name, sql, parameters)
        }
    }

    private func named(_ name: String, _ sql: String, _ parameters: [String?]) throws(PostgresError) -> PostgresResult {
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
        try self.traced(StatementTrace.summary(of: sql)) { (comment) throws(PostgresError) in
            _ = try self.check(self.awaitResult(sent: PQsendQuery(self.handle, comment.map { $0 + sql } ?? sql)))
        }
    }

    /// Runs one statement in its span (a client span, child of ``trace``'s parent) when there is a trace: `run`
    /// gets the sqlcommenter comment to put before the statement's text when the span is sampled and the trace
    /// wants it (``StatementTrace/Comment``; nil otherwise, and always without a trace: the text is then exactly
    /// the caller's). The span never carries parameter
    /// values: only the statement's summary, the database, and the SQLSTATE of a failure.
    private func traced<T>(
        _ name: @autoclosure () -> String, _ run: (String?) throws(PostgresError) -> T
    ) throws(PostgresError) -> T {
        guard let trace = self.trace else { return try run(nil) }
        let summary = name()
        guard let span = Traces.startSpan(summary, kind: .client, parent: trace.parent, links: trace.links) else {
            return try run(nil)
        }
        defer { span.end() }
        span.set("db.system.name", "postgresql")
        span.set("db.namespace", .string(self.databaseName))
        span.set("db.query.summary", .string(summary))
        do {
            let comment = trace.comment == .whenSampled ? span.sampledTraceParent : nil
            return try run(comment.map { "/*traceparent='\($0)'*/ " })
        } catch {
            if let sqlState = error.sqlState { span.set("db.response.status_code", .string(sqlState)) }
            span.set("error.type", .string(error.sqlState ?? error.code.description))
            span.setStatus(SpanStatus(code: .error))
            throw error
        }
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
                            message:
                                "no answer from the database within \(Self.seconds(self.statementDeadlineSeconds ?? 0)) s; statement cancelled and connection dropped (a COMMIT waits forever when synchronous_standby_names names a standby that is not connected)",
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

    /// Gives up on the statement in flight without waiting for the server: cuts the connection, then has the
    /// server asked to cancel the statement from elsewhere (``CancelRequests``: which also ends a wait for
    /// synchronous replication, leaving the transaction committed locally). Asking here would wait for a server
    /// that may not answer at all.
    private func abandon() {
        let cancel = PQgetCancel(self.handle)  // before the socket goes: it needs the connection's address and key
        let socket = PQsocket(self.handle)
        if socket >= 0 { _ = shutdown(socket, Int32(SHUT_RDWR)) }
        self.isBroken = true
        if let cancel { CancelRequests.send(cancel) }
    }

    private static func monotonicSeconds() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }

    private static func seconds(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(value)
    }

    /// A way to cancel, from another thread, the statement this connection runs next (made here, on the
    /// connection's own thread, as libpq requires). Nil when libpq cannot make one (out of memory).
    public func makeCanceller() -> StatementCanceller? {
        PQgetCancel(self.handle).map(StatementCanceller.init)
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

    /// Waits up to `timeoutMilliseconds` for notifications and returns those that arrived (maybe none). The wait
    /// ends early, with what has arrived so far, once `interrupter` is interrupted (and at once in every wait after).
    public func waitForNotifications(
        timeoutMilliseconds: Int32, interrupter: WaitInterrupter? = nil
    ) throws(PostgresError) -> [Notification] {
        var notifications = self.drainNotifications()
        guard notifications.isEmpty else { return notifications }
        let socket = PQsocket(self.handle)
        guard socket >= 0 else {
            self.isBroken = true
            throw PostgresError(code: .connectionLost, message: "connection has no socket")
        }
        var pollers = [pollfd(fd: socket, events: Int16(POLLIN), revents: 0)]
        if let interrupter { pollers.append(pollfd(fd: interrupter.readEnd, events: Int16(POLLIN), revents: 0)) }
        let ready = poll(&pollers, nfds_t(pollers.count), timeoutMilliseconds)
        if ready > 0 && pollers[0].revents != 0 {
            guard PQconsumeInput(self.handle) == 1 else {
                self.isBroken = true
                throw PostgresError(
                    code: .connectionLost, message: String(cString: PQerrorMessage(self.handle)), mask: self.mask)
            }
            notifications = self.drainNotifications()
        }
        if PQstatus(self.handle) != CONNECTION_OK {
            self.isBroken = true
            throw PostgresError(
                code: .connectionLost, message: String(cString: PQerrorMessage(self.handle)), mask: self.mask)
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
                message: String(cString: PQerrorMessage(self.handle)), mask: self.mask)
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
            throw PostgresError(
                code: lost ? .connectionLost : .queryFailed, message: message, sqlState: sqlState, mask: self.mask)
        }
    }

    // MARK: C strings

    private static func withCStrings<R, E: Error>(
        _ strings: [String], _ body: ([UnsafePointer<CChar>?]) throws(E) -> R
    ) throws(E) -> R {
        let copies = strings.map { strdup($0) }
        defer { for copy in copies { free(copy) } }
        return try body(copies.map { $0.map { UnsafePointer($0) } } + [nil])
    }

    private static func withOptionalCStrings<R>(_ strings: [String?], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
        let copies = strings.map { $0.map { strdup($0) } ?? nil }
        defer { for copy in copies { free(copy) } }
        return body(copies.map { $0.map { UnsafePointer($0) } })
    }
}

/// Where a connection's statements belong in a trace: the parent of their spans, the spans they are linked to
/// (the requests a batched read serves), and whether a sampled statement's text names its trace.
public struct StatementTrace: Sendable {
    /// Whether a sampled statement carries the sqlcommenter comment (`/*traceparent='…'*/`) before its text.
    public enum Comment: Sendable, Equatable {
        /// A sampled statement's text starts with the comment (so `pg_stat_activity` and the server's log name its
        /// trace); a prepared statement is then sent unnamed, parsed and planned again, since its text differs.
        case whenSampled
        /// Never: the statement keeps its exact text and its prepared statement. The trace is carried by the
        /// statement's span alone.
        case never
    }

    public var parent: ServiceContext
    public var links: [ServiceContext]
    public var comment: Comment

    public init(parent: ServiceContext, links: [ServiceContext] = [], comment: Comment = .whenSampled) {
        self.parent = parent
        self.links = links
        self.comment = comment
    }

    /// A statement's `db.query.summary` when it has no name: its first keyword (`SELECT`, `BEGIN`), never more of
    /// its text.
    static func summary(of sql: String) -> String {
        let word = sql.drop { $0 == " " || $0 == "\n" || $0 == "\t" }.prefix { $0.isLetter }
        return word.isEmpty ? "statement" : word.uppercased()
    }
}

/// Ends a connection's ``PostgresConnection/waitForNotifications(timeoutMilliseconds:interrupter:)`` from another
/// thread (libpq's own wait cannot be interrupted): a pipe the wait polls beside the connection's socket. Once
/// interrupted it stays so: each later wait returns at once.
public final class WaitInterrupter: Sendable {
    let readEnd: Int32
    private let writeEnd: Int32

    public init() throws(PostgresError) {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else {
            throw PostgresError(
                code: .connectionFailed, message: "cannot make a pipe to end waits: \(String(cString: strerror(errno)))"
            )
        }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        _ = fcntl(ends[1], F_SETFL, fcntl(ends[1], F_GETFL) | O_NONBLOCK)
        self.readEnd = ends[0]
        self.writeEnd = ends[1]
    }

    /// Ends the current wait and every later one. Safe from any thread, any number of times.
    public func interrupt() {
        var byte: UInt8 = 1
        _ = write(self.writeEnd, &byte, 1)  // a full pipe already reads as ready
    }

    deinit {
        close(self.readEnd)
        close(self.writeEnd)
    }
}

/// Asks the server to cancel the statement a connection is running (libpq's `PQcancel`, which may be called from any
/// thread). The statement fails with SQLSTATE 57014 and the connection stays usable.
public final class StatementCanceller: @unchecked Sendable {  // PGcancel is made for use from other threads
    private let cancel: OpaquePointer

    init(_ cancel: OpaquePointer) {
        self.cancel = cancel
    }

    /// Blocking (it opens a connection of its own to the server): call it from a thread-pool thread.
    public func cancelStatement() {
        var buffer = [CChar](repeating: 0, count: 256)
        _ = PQcancel(self.cancel, &buffer, Int32(buffer.count))
    }

    deinit { PQfreeCancel(self.cancel) }
}
