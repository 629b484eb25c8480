import CoreMetrics
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import MetricsdPostgres
import NIOCore
import Synchronization

/// The request context of every route: the authenticated user, and a 16 KiB body limit (bigger bodies get 413).
public struct AppRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// Set by `UserAuthMiddleware` from the token's `sub`.
    public var userID: Int64?
    /// The correlation id (`X-Request-Id`).
    public var requestID: String = ""

    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
    }

    public var maxUploadSize: Int { 16 * 1024 }
}

/// Outermost middleware: correlation id, error bodies, overload shedding, per-route metrics and 405s.
///
/// - Every response carries `X-Request-Id` (the client's when it is 1–64 characters of `[A-Za-z0-9._-]`, else a
///   new one), and every log line about the request carries it as `metricsd.request.id`.
/// - Every error, Hummingbird's own included, becomes `{"error": …, "statusCode": …}`. Unexpected errors are a
///   500 whose body says only "internal server error" and the request id; the details go to the log.
/// - A request whose `Content-Length` is over 16 KiB gets 413 at once, whatever the route.
/// - Beyond `maxInFlight` concurrent requests, new ones get an immediate 503 instead of queueing: memory stays
///   bounded and clients get a fast answer under overload.
struct EdgeMiddleware: RouterMiddleware {
    typealias Context = AppRequestContext

    let maxInFlight: Int
    let inFlight: InFlightCounter
    let routes: KnownRoutes

    func handle(
        _ request: Request, context: AppRequestContext,
        next: (Request, AppRequestContext) async throws -> Response
    ) async throws -> Response {
        var context = context
        let requestID = Self.requestID(from: request.headers[.requestID])
        context.requestID = requestID
        context.logger = Self.requestLogger(context.logger, requestID: requestID)
        let started = ContinuousClock.now
        var response: Response
        var route = "unmatched"
        if let declared = request.headers[.contentLength].flatMap({ Int($0) }), declared > context.maxUploadSize {
            // A declared body over the limit is refused on every route before anything reads it (routes that
            // read a body also enforce the limit on what arrives, chunked bodies included).
            response = AppError(.contentTooLarge, "request body is larger than 16 KiB").response(requestID: requestID)
            route = "too_large"
        } else if self.inFlight.enter(limit: self.maxInFlight) {
            defer { self.inFlight.leave() }
            do {
                response = try await next(request, context)
                route = context.coreContext.endpointPath.value ?? route
            } catch {
                route = context.coreContext.endpointPath.value ?? route
                response = self.errorResponse(error, request: request, context: context, requestID: requestID)
            }
        } else {
            response = AppError.unavailable("server busy, retry shortly").response(requestID: requestID)
            route = "shed"
        }
        if route == "NotFound" { route = "unmatched" }
        response.headers[.requestID] = requestID
        HTTPMetrics.record(route: route, method: request.method, status: response.status.code, since: started)
        return response
    }

    private func errorResponse(_ error: any Error, request: Request, context: AppRequestContext, requestID: String)
        -> Response
    {
        if let error = error as? any HTTPResponseError {
            let status = error.status
            if status == .notFound, let allowed = self.routes.allowedMethods(for: request.uri.path) {
                var methodError = AppError(.methodNotAllowed, "method \(request.method.rawValue) is not allowed here")
                methodError.headers[.allow] = allowed.joined(separator: ", ")
                return methodError.response(requestID: requestID)
            }
            let message: String
            switch status {
            case .notFound: message = "no such route: \(request.method.rawValue) \(Self.shownPath(request.uri.path))"
            case .contentTooLarge: message = "request body is larger than 16 KiB"
            default: message = (error as? HTTPError)?.body ?? status.reasonPhrase
            }
            return AppError(status, message).response(requestID: requestID)
        }
        return Self.appError(for: error, logger: context.logger, requestID: requestID).response(requestID: requestID)
    }

    /// The answer to an error a handler threw (Hummingbird's own HTTP errors aside), logged when it is the
    /// server's fault: shared by the router and the hot path (`TodayFastPath`).
    static func appError(for error: any Error, logger: Logger, requestID: String) -> AppError {
        switch error {
        case let error as AppError:
            if error.status.code >= 500 {
                logger.warning("Request failed", metadata: ["metricsd.error": "\(error.message)"])
            }
            return error
        case let error as PostgresError where error.isTransient || error.code == .poolClosed:
            logger.warning("Database unavailable", metadata: ["metricsd.error": "\(error)"])
            return AppError.unavailable("database unavailable, retry shortly")
        default:
            logger.error("Unhandled error", metadata: ["metricsd.error": "\(String(reflecting: error))"])
            return AppError(.internalServerError, "internal server error (request \(requestID))")
        }
    }

    /// A request's logger: every line carries its id (shared with the hot path, which makes one only to log).
    static func requestLogger(_ base: Logger, requestID: String) -> Logger {
        var logger = base
        logger[metadataKey: "hb.request.id"] = .string(requestID)
        logger[metadataKey: "metricsd.request.id"] = .string(requestID)
        return logger
    }

    /// The client's id when well-formed, else a new random one.
    static func requestID(from header: String?) -> String {
        if let header, (1...64).contains(header.utf8.count),
            header.utf8.allSatisfy({ byte in
                (byte >= 48 && byte <= 57) || (byte >= 65 && byte <= 90) || (byte >= 97 && byte <= 122)
                    || byte == 45 || byte == 46 || byte == 95
            })
        {
            return header
        }
        return Self.newRequestID()
    }

    /// A new id: 16 hex digits, unique within the process (a counter through a bijective mixer, seeded from the
    /// system's random source once, so ids do not repeat across restarts either). No system call per request.
    static func newRequestID() -> String {
        var value = Self.requestSeed &+ Self.requestCounter.add(1, ordering: .relaxed).newValue &* 0x9E37_79B9_7F4A_7C15
        value = (value ^ (value >> 30)) &* 0xBF58_476D_1CE4_E5B9
        value = (value ^ (value >> 27)) &* 0x94D0_49BB_1331_11EB
        value ^= value >> 31
        return String(unsafeUninitializedCapacity: 16) { buffer in
            let digits: StaticString = "0123456789abcdef"
            for index in 0..<16 {
                buffer[index] = digits.utf8Start[Int((value >> UInt64(60 - 4 * index)) & 0xF)]
            }
            return 16
        }
    }

    private static let requestSeed: UInt64 = {
        var generator = SystemRandomNumberGenerator()
        return generator.next()
    }()
    private static let requestCounter = Atomic<UInt64>(0)

    /// A path as echoed in an error: printable ASCII only, at most 100 characters.
    static func shownPath(_ path: String) -> String {
        let printable = path.unicodeScalars.prefix(100).map { $0.value >= 0x21 && $0.value < 0x7f ? Character($0) : "?" }
        return String(printable) + (path.unicodeScalars.count > 100 ? "…" : "")
    }
}

/// Requests in flight, for overload shedding; also `metricsd_http_requests_in_flight` on `/metrics`.
final class InFlightCounter: Sendable {
    private let count = Atomic<Int>(0)
    private let gauge = Gauge(label: "metricsd_http_requests_in_flight")

    /// Takes a slot if fewer than `limit` are taken.
    func enter(limit: Int) -> Bool {
        let new = self.count.add(1, ordering: .relaxed).newValue
        if new > limit {
            self.count.subtract(1, ordering: .relaxed)
            return false
        }
        self.gauge.record(new)
        return true
    }

    func leave() {
        // (Concurrent enters and leaves may record out of order; the next change corrects the gauge.)
        self.gauge.record(self.count.subtract(1, ordering: .relaxed).newValue)
    }

    var current: Int { self.count.load(ordering: .relaxed) }
}

/// The API's paths and their methods, for answering 405 (with `Allow`) rather than 404 on a known path.
struct KnownRoutes: Sendable {
    /// Path patterns (`{id}` matches one segment) and their methods.
    let routes: [(pattern: [Substring], methods: [String])]

    init(_ routes: [(String, [String])]) {
        self.routes = routes.map { (pattern: $0.0.split(separator: "/"), methods: $0.1) }
    }

    func allowedMethods(for path: String) -> [String]? {
        let segments = path.split(separator: "/")
        for route in self.routes where route.pattern.count == segments.count {
            let matches = zip(route.pattern, segments).allSatisfy { pattern, segment in
                pattern.hasPrefix("{") || pattern == segment
            }
            if matches { return route.methods }
        }
        return nil
    }
}

/// HTTP series for `/metrics`: requests by route and status, latency by route.
///
/// The metric objects are made once per (route, method, status) and kept: making them asks the metrics backend
/// to look its registry up (a lock, label strings) on every request otherwise. Routes are the router's
/// patterns (plus "unmatched", "shed", "too_large"), so the set stays small whatever clients send.
enum HTTPMetrics {
    private struct Key: Hashable {
        let route: String
        let method: String
        let status: Int
    }

    private static let cache = Mutex<[Key: (CoreMetrics.Counter, CoreMetrics.Timer)]>([:])

    static func record(route: String, method: HTTPRequest.Method, status: Int, since started: ContinuousClock.Instant) {
        let elapsed = (ContinuousClock.now - started).components
        let nanoseconds = elapsed.seconds * 1_000_000_000 + elapsed.attoseconds / 1_000_000_000
        let key = Key(route: route, method: method.rawValue, status: status)
        let (counter, timer) = Self.cache.withLock { cache in
            if let cached = cache[key] { return cached }
            let made = (
                Counter(
                    label: "metricsd_http_requests_total",
                    dimensions: [("route", route), ("method", key.method), ("status", String(status))]),
                CoreMetrics.Timer(label: "metricsd_http_request_duration_seconds", dimensions: [("route", route)])
            )
            cache[key] = made
            return made
        }
        counter.increment()
        timer.recordNanoseconds(nanoseconds)
    }
}
