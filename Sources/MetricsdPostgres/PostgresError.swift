import HealthMetrics
import MetricsdMasking

/// An error from PostgreSQL or from talking to it, with the server's SQLSTATE when there is one.
///
/// Its message never holds a password: every message goes through ``SecretMask`` when the error is made — the
/// pattern rules always, and the known passwords of the connection it came from (``ConnectionSettings/mask``).
/// Its stable code (``errorCode``) is `database.` and the ``Code`` in snake case: `database.connection_failed`.
public struct PostgresError: CodedError, Sendable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Sendable {
            case badConnectionString, connectionFailed, connectionLost, queryFailed, unexpectedResult
            case poolTimeout, poolClosed
        }
        private let base: Base

        /// `DATABASE_URL` (or the `PG*` environment) is not a valid libpq connection string.
        public static let badConnectionString = Code(base: .badConnectionString)
        /// A new connection could not be opened (server down, refused, authentication, too many connections).
        public static let connectionFailed = Code(base: .connectionFailed)
        /// An open connection broke while in use (server restarted, backend terminated, network).
        public static let connectionLost = Code(base: .connectionLost)
        /// The server rejected a statement; `sqlState` says why.
        public static let queryFailed = Code(base: .queryFailed)
        /// The server answered with a shape the code did not expect (wrong column count, unparsable value).
        public static let unexpectedResult = Code(base: .unexpectedResult)
        /// No connection became free within the pool's wait limit.
        public static let poolTimeout = Code(base: .poolTimeout)
        /// The pool is shut down.
        public static let poolClosed = Code(base: .poolClosed)

        public var description: String { self.base.rawValue }

        /// The stable code (``CodedError``): `database.connection_failed`, … A connection string libpq refuses is
        /// a configuration error wherever it is reported: `config.database_url_invalid`.
        public var errorCode: String {
            switch self.base {
            case .badConnectionString: "config.database_url_invalid"
            case .connectionFailed: "database.connection_failed"
            case .connectionLost: "database.connection_lost"
            case .queryFailed: "database.query_failed"
            case .unexpectedResult: "database.unexpected_result"
            case .poolTimeout: "database.pool_timeout"
            case .poolClosed: "database.pool_closed"
            }
        }

        /// Every code, for the list of error codes.
        public static let all: [Code] = [
            .badConnectionString, .connectionFailed, .connectionLost, .queryFailed, .unexpectedResult, .poolTimeout,
            .poolClosed,
        ]
    }

    public let code: Code
    /// The server's (or libpq's) message, one line, passwords masked.
    public let message: String
    /// The five-character SQLSTATE, e.g. `23505` (unique violation), `57P01` (admin shutdown).
    public let sqlState: String?

    /// - Parameter mask: the passwords to mask besides the patterns (those of the connection the error came from).
    public init(code: Code, message: String, sqlState: String? = nil, mask: SecretMask = SecretMask()) {
        self.code = code
        self.message = mask.apply(message.trimmingWhitespaceAndNewlines())
        self.sqlState = sqlState
    }

    /// This error with `mask`'s secrets masked too (for an error that crossed from another connection's code).
    public func masked(by mask: SecretMask) -> PostgresError {
        PostgresError(code: self.code, message: self.message, sqlState: self.sqlState, mask: mask)
    }

    public var errorCode: String { self.code.errorCode }

    public var description: String {
        if let sqlState { return "\(self.message) (SQLSTATE \(sqlState))" }
        return self.message
    }

    /// A few words on why the database cannot be used, without host names, ports or socket paths: for
    /// unauthenticated answers such as `/readyz` (the full message goes to logs and systemd's STATUS).
    public var summary: String {
        switch self.code {
        case .poolTimeout: return "no free connection"
        case .poolClosed: return "shutting down"
        case .badConnectionString: return "invalid DATABASE_URL"
        default: break
        }
        let known: [(String, String)] = [
            // First: with a multi-host string libpq reports every host, e.g. one refused and one a standby.
            ("is read-only", "no read-write server reachable"),
            ("read-only transaction", "no read-write server reachable"),
            ("hot standby", "no read-write server reachable"),
            ("no answer from the database within", "database not answering"),
            ("Connection refused", "connection refused"), ("timeout expired", "connection timed out"),
            ("authentication failed", "authentication failed"), ("too many clients", "too many connections"),
            ("remaining connection slots", "too many connections"), ("is starting up", "database starting up"),
            ("is shutting down", "database shutting down"), ("administrator command", "connection terminated"),
            ("does not exist", "database or role does not exist"),
            ("could not translate host name", "host name not found"),
            ("No such file or directory", "no server at the socket"),
            ("server closed the connection", "connection lost"),
            ("SSL", "SSL error"),
        ]
        for (needle, summary) in known where self.message.contains(needle) { return summary }
        switch self.code {
        case .connectionLost: return "connection lost"
        case .queryFailed: return "query failed" + (self.sqlState.map { " (SQLSTATE \($0))" } ?? "")
        default: return "connection failed"
        }
    }

    /// True when the server did not answer within the time it was given: a statement past its deadline (the
    /// connection was dropped) or a connection not opened within the caller's bound. The server may be frozen
    /// (accepting TCP, answering nothing): asking it again at once would only wait as long once more.
    public var isUnanswered: Bool { self.message.hasPrefix("no answer from the database within") }

    /// True when the failure is about reaching the database rather than about a statement: worth waiting and
    /// retrying on another connection (server restarting, connection cut, too many connections, pool busy).
    public var isTransient: Bool {
        switch self.code {
        case .connectionFailed, .connectionLost, .poolTimeout: return true
        case .queryFailed:
            guard let sqlState else { return false }
            // 08: connection exception; 57P0x: operator intervention (admin/crash shutdown, cannot connect now);
            // 53300: too many connections; 40001/40P01: serialization failure, deadlock.
            return sqlState.hasPrefix("08") || sqlState.hasPrefix("57P") || sqlState == "53300"
                || sqlState == "40001" || sqlState == "40P01"
        default: return false
        }
    }
}

extension String {
    /// The text with leading and trailing whitespace and newlines removed; inner newlines become spaces so a
    /// server message stays one log line.
    func trimmingWhitespaceAndNewlines() -> String {
        let scalars = self.unicodeScalars
        var start = scalars.startIndex
        var end = scalars.endIndex
        while start < end, scalars[start].properties.isWhitespace { start = scalars.index(after: start) }
        while end > start, scalars[scalars.index(before: end)].properties.isWhitespace {
            end = scalars.index(before: end)
        }
        return String(
            String.UnicodeScalarView(scalars[start..<end]).map { $0 == "\n" || $0 == "\r" ? " " : Character($0) })
    }
}
