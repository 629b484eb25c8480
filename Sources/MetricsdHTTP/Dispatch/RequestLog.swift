import HTTPTypes
import Logging
import Synchronization

/// `METRICSD_REQUEST_LOG`: which requests get a request log line.
public enum RequestLogMode: String, Sendable, CaseIterable {
    /// No request lines (errors the server causes are still logged as warnings and errors).
    case off
    /// Requests answered with a 4xx or 5xx status (the default): refused tokens, unknown users, overload,
    /// failures. Successful reads of a busy service leave no line.
    case errors
    /// Every request.
    case all

    /// The default, `errors`: a line per failed request costs nothing measurable at full load, one per
    /// request does (README, Performance).
    public static let `default` = RequestLogMode.errors
}

/// One structured line per request, the same for every route: method, route template, status, duration, the
/// user id when authenticated, the request id, the client's address and an error reply's code, as journal fields
/// (`HTTP_METHOD`, `HTTP_ROUTE`, `HTTP_STATUS`, `HTTP_DURATION_MS`, `USER_ID`, `REQUEST_ID`, `HTTP_CLIENT`,
/// `ERROR_CODE`), so `journalctl -u metricsd USER_ID=42` finds a user's requests and `ERROR_CODE=token.expired`
/// every expired token. The client is the connection's peer, or behind a trusted proxy the address it forwarded
/// (``TrustedProxies``).
///
/// The mode changes on reload (SIGHUP). Lines are written at `info` whatever `METRICSD_LOG_LEVEL` says: the
/// request log has its own switch.
public final class RequestLog: Sendable {
    private let storedMode: Atomic<UInt8>
    private let logger: Logger

    /// - Parameter logger: where lines go; the daemon passes a logger whose level is fixed at `info`.
    public init(mode: RequestLogMode, logger: Logger) {
        self.storedMode = Atomic(Self.code(mode))
        self.logger = logger
    }

    public var mode: RequestLogMode {
        get { Self.modes[Int(self.storedMode.load(ordering: .relaxed))] }
        set { self.storedMode.store(Self.code(newValue), ordering: .relaxed) }
    }

    private static let modes = RequestLogMode.allCases
    private static func code(_ mode: RequestLogMode) -> UInt8 { UInt8(Self.modes.firstIndex(of: mode)!) }

    func record(
        method: HTTPRequest.Method, route: String, status: Int, started: ContinuousClock.Instant, userID: Int64?,
        requestID: String, client: String = "", errorCode: String? = nil
    ) {
        switch self.mode {
        case .off: return
        case .errors where status < 400: return
        case .errors, .all: break
        }
        let elapsed = (ContinuousClock.now - started).components
        let microseconds = elapsed.seconds * 1_000_000 + elapsed.attoseconds / 1_000_000_000_000
        let milliseconds = Self.milliseconds(microseconds)
        var metadata: Logger.Metadata = [
            "metricsd.http.method": .string(method.rawValue), "metricsd.http.route": .string(route),
            "metricsd.http.status": .stringConvertible(status), "metricsd.http.duration_ms": .string(milliseconds),
            "metricsd.request.id": .string(requestID),
        ]
        if !client.isEmpty { metadata["metricsd.http.client"] = .string(client) }
        if let userID { metadata["metricsd.user.id"] = .stringConvertible(userID) }
        if let errorCode { metadata["metricsd.error.code"] = .string(errorCode) }
        self.logger.log(
            level: .info, "\(method.rawValue) \(route) \(status) \(milliseconds) ms", metadata: metadata)
    }

    /// Microseconds as milliseconds with three decimals ("1.234").
    static func milliseconds(_ microseconds: Int64) -> String {
        let whole = microseconds / 1000
        let fraction = microseconds % 1000
        return "\(whole)." + (fraction < 10 ? "00" : fraction < 100 ? "0" : "") + String(fraction)
    }
}
