import CoreMetrics
import HTTPTypes
import HealthMetrics
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// The one path every HTTP request takes, whatever its route.
///
/// In order: the request id; a body over 16 KiB is a 413; the route (404, or 405 with `Allow`); the in-flight
/// limit (a fast 503 with `Retry-After` instead of a queue); authentication (401 with `WWW-Authenticate`); the
/// endpoint's handler; errors mapped to `{"error": …, "statusCode": …}` (an unexpected one is a 500 naming the
/// request id, its detail logged); then the common headers, the `metricsd_http_*` metrics and the request log
/// line. The reply is handed back on the connection's event loop.
///
/// The busiest request, `GET /v1/profile/metrics/today`, is answered without leaving the event loop except for
/// the database read itself (a callback handler, `Endpoint.Handler.callback`): no task, no async sequence, no
/// per-request allocation beyond the request's own strings. That is why this dispatcher is not Hummingbird's
/// router (which runs every request in a task behind an async sequence): on this project's 2-core benchmark the
/// router alone topped out below the database's own read ceiling (README, Performance).
final class APIDispatcher: Sendable {
    /// Bodies above this are refused with 413, whatever the route.
    static let maxBodySize = 16 * 1024

    private let routes: RouteTable
    let credentials: CredentialBox
    let inFlight: InFlightCounter
    let maxInFlight: Int
    let requestLog: RequestLog
    let logger: Logger

    init(
        endpoints: [Endpoint], credentials: CredentialBox, inFlight: InFlightCounter, maxInFlight: Int,
        requestLog: RequestLog, logger: Logger
    ) {
        self.routes = RouteTable(endpoints)
        self.credentials = credentials
        self.inFlight = inFlight
        self.maxInFlight = maxInFlight
        self.requestLog = requestLog
        self.logger = logger
    }

    /// The answer to one request, handed to `completion` on `eventLoop` (exactly once) with the request id.
    /// - Parameter bodyTooLarge: the body is (or is declared to be) over ``maxBodySize``; `body` is incomplete.
    func respond(
        to head: HTTPRequestHead, body: ByteBuffer, bodyTooLarge: Bool, on eventLoop: any EventLoop,
        completion: @escaping (Reply, String) -> Void
    ) {
        let started = ContinuousClock.now
        let fields = RequestFields(head.headers)
        let method = HTTPRequest.Method(head.method)
        let requestID = Self.requestID(from: fields.requestID)
        let finish = Finish(dispatcher: self, method: method, requestID: requestID, started: started, completion: completion)
        if bodyTooLarge {
            finish(.error(AppError(.contentTooLarge, "request body is larger than 16 KiB")), route: "too_large", userID: nil)
            return
        }
        let endpoint: Endpoint
        let parameter: Substring?
        switch self.routes.match(method: method, path: head.uri) {
        case .found(let found, let value):
            endpoint = found
            parameter = value
        case .methodNotAllowed(let allowed):
            var error = AppError(.methodNotAllowed, "method \(method.rawValue) is not allowed here")
            error.headers[.allow] = allowed.joined(separator: ", ")
            finish(.error(error), route: "unmatched", userID: nil)
            return
        case .notFound:
            let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? head.uri
            finish(.error(AppError(.notFound, "no such route: \(method.rawValue) \(Self.shownPath(path))")), route: "unmatched", userID: nil)
            return
        }
        guard self.inFlight.enter(limit: self.maxInFlight) else {
            finish(.error(AppError.unavailable("server busy, retry shortly")), route: "shed", userID: nil)
            return
        }
        let route = endpoint.route
        var userID: Int64?
        do throws(AppError) {
            switch endpoint.access {
            case .open: break
            case .user:
                userID = try self.authenticatedUser(fields.authorization, requestID: requestID)
            case .admin:
                let token = try bearerToken(fields.authorization)
                guard let check = self.credentials.current.admin, check.matches(token) else {
                    Self.requestLogger(self.logger, requestID: requestID, userID: nil).notice("Admin token refused")
                    throw AppError.unauthorized("invalid admin token")
                }
            }
        } catch {
            self.inFlight.leave()
            finish(.error(error), route: route, userID: nil)
            return
        }
        let request = EndpointRequest(
            head: head, body: body, parameter: parameter, requestID: requestID, userID: userID, eventLoop: eventLoop,
            logger: self.logger)
        let user = userID
        switch endpoint.handler {
        case .immediate(let handle):
            let reply: Reply
            do {
                reply = try handle(request)
            } catch {
                reply = self.errorReply(error, requestID: requestID, userID: user)
            }
            self.inFlight.leave()
            finish(reply, route: route, userID: user)
        case .callback(let handle):
            let bound = NIOLoopBound(finish, eventLoop: eventLoop)
            handle(request) { result in
                let reply: Reply
                switch result {
                case .success(let value): reply = value
                case .failure(let error): reply = self.errorReply(error, requestID: requestID, userID: user)
                }
                if eventLoop.inEventLoop {
                    self.inFlight.leave()
                    bound.value(reply, route: route, userID: user)
                } else {
                    eventLoop.execute {
                        self.inFlight.leave()
                        bound.value(reply, route: route, userID: user)
                    }
                }
            }
        case .async(let handle):
            let bound = NIOLoopBound(finish, eventLoop: eventLoop)
            Task {
                let reply: Reply
                do {
                    reply = try await handle(request)
                } catch {
                    reply = self.errorReply(error, requestID: requestID, userID: user)
                }
                eventLoop.execute {
                    self.inFlight.leave()
                    bound.value(reply, route: route, userID: user)
                }
            }
        }
    }

    /// Completes a request: metrics, the request log line, then the connection's writer (which adds the common
    /// headers as it writes the reply).
    private struct Finish {
        let dispatcher: APIDispatcher
        let method: HTTPRequest.Method
        let requestID: String
        let started: ContinuousClock.Instant
        let completion: (Reply, String) -> Void

        func callAsFunction(_ reply: Reply, route: String, userID: Int64?) {
            let status = reply.status.code
            HTTPMetrics.record(route: route, method: self.method, status: status, since: self.started)
            self.dispatcher.requestLog.record(
                method: self.method, route: route, status: status, started: self.started, userID: userID,
                requestID: self.requestID)
            self.completion(reply, self.requestID)
        }
    }

    // MARK: Authentication

    /// The user id (`sub`) of a bearer token, or the 401 to answer, its reason logged at debug level.
    func authenticatedUser(_ authorization: String?, requestID: String) throws(AppError) -> Int64 {
        let token = try bearerToken(authorization)
        do {
            return try self.credentials.current.tokens.verify(token)
        } catch {
            let logger = Self.requestLogger(self.logger, requestID: requestID, userID: nil)
            logger.debug("Token refused", metadata: ["metricsd.reason": "\(error.message)"])
            throw AppError.unauthorized(error.message)
        }
    }

    // MARK: Errors

    /// The reply to an error a handler threw, logged when it is the server's fault.
    func errorReply(_ error: any Error, requestID: String, userID: Int64?) -> Reply {
        .error(Self.appError(for: error, logger: Self.requestLogger(self.logger, requestID: requestID, userID: userID), requestID: requestID))
    }

    /// What the client is told about an error; logged when it is the server's fault (never with details in the
    /// answer: a 500 names only the request id, the log line has the rest).
    static func appError(for error: any Error, logger: Logger, requestID: String) -> AppError {
        switch error {
        case let error as AppError:
            if error.status.code >= 500 {
                logger.warning("Request failed", metadata: ["metricsd.error": "\(error.message)"])
            }
            return error
        case let error as any ClientFacingError where error.clientError != nil:
            logger.warning("Request failed", metadata: ["metricsd.error": "\(error)"])
            return error.clientError!
        default:
            logger.error("Unhandled error", metadata: ["metricsd.error": "\(String(reflecting: error))"])
            return AppError(.internalServerError, "internal server error (request \(requestID))")
        }
    }

    // MARK: Request ids and loggers

    /// A request's logger: every line carries its id, and the user id once authenticated.
    static func requestLogger(_ base: Logger, requestID: String, userID: Int64?) -> Logger {
        var logger = base
        logger[metadataKey: "metricsd.request.id"] = .string(requestID)
        if let userID { logger[metadataKey: "metricsd.user.id"] = .stringConvertible(userID) }
        return logger
    }

    /// The client's id when well-formed (1–64 characters of `[A-Za-z0-9._-]`), else a new one.
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

/// The few request headers the dispatcher reads, found in one pass. Repeated `Authorization` or `X-Request-Id`
/// headers are joined with ", " (as HTTP joins repeated fields), so an ambiguous credential is never valid.
struct RequestFields {
    var authorization: String?
    var requestID: String?

    init(_ headers: HTTPHeaders) {
        for (name, value) in headers {
            if Self.equalsIgnoringCase(name, "authorization") {
                self.authorization = self.authorization.map { $0 + ", " + value } ?? value
            } else if Self.equalsIgnoringCase(name, "x-request-id") {
                self.requestID = self.requestID.map { $0 + ", " + value } ?? value
            }
        }
    }

    /// ASCII case-insensitive comparison with a lowercase name (no allocation).
    static func equalsIgnoringCase(_ name: String, _ lowercase: StaticString) -> Bool {
        guard name.utf8.count == lowercase.utf8CodeUnitCount else { return false }
        return lowercase.withUTF8Buffer { expected in
            var index = 0
            for byte in name.utf8 {
                let folded = byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte
                guard folded == expected[index] else { return false }
                index += 1
            }
            return true
        }
    }
}

extension HTTPRequest.Method {
    /// The method of a request NIO decoded.
    init(_ method: NIOHTTP1.HTTPMethod) {
        switch method {
        case .GET: self = .get
        case .POST: self = .post
        case .PUT: self = .put
        case .DELETE: self = .delete
        case .HEAD: self = .head
        case .OPTIONS: self = .options
        case .PATCH: self = .patch
        default: self = HTTPRequest.Method(method.rawValue) ?? HTTPRequest.Method("UNKNOWN")!
        }
    }
}

/// The bearer token of an `Authorization` header value, or a 401 saying what is wrong with it.
func bearerToken(_ header: String?) throws(AppError) -> Substring {
    guard let header else {
        throw AppError.unauthorized("missing bearer token")
    }
    let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
    guard parts.count == 2, parts[0].lowercased() == "bearer", !parts[1].isEmpty else {
        throw AppError.unauthorized("malformed Authorization header: expected 'Bearer <token>'")
    }
    return parts[1]
}

/// The endpoints by method and path.
///
/// Paths are compared segment by segment (the query string dropped); `{name}` matches any one segment. A path
/// with an empty or dot segment is not routed (404). A path that exists with other methods is a 405 naming them.
struct RouteTable: Sendable {
    enum Match {
        case found(Endpoint, parameter: Substring?)
        case methodNotAllowed([String])
        case notFound
    }

    private struct Entry: Sendable {
        let segments: [Substring]
        let endpoints: [Endpoint]
        let parameterIndex: Int?
    }

    /// Routes without parameters by their normalised path: one dictionary lookup for the common case.
    private let exact: [String: Entry]
    private let parameterised: [Entry]

    init(_ endpoints: [Endpoint]) {
        var byRoute: [String: [Endpoint]] = [:]
        var order: [String] = []
        for endpoint in endpoints {
            if byRoute[endpoint.route] == nil { order.append(endpoint.route) }
            byRoute[endpoint.route, default: []].append(endpoint)
        }
        var exact: [String: Entry] = [:]
        var parameterised: [Entry] = []
        for route in order {
            let segments = route.split(separator: "/")
            let parameterIndex = segments.firstIndex { $0.hasPrefix("{") }
            let entry = Entry(segments: segments, endpoints: byRoute[route]!, parameterIndex: parameterIndex)
            if parameterIndex == nil {
                exact["/" + segments.joined(separator: "/")] = entry
            } else {
                parameterised.append(entry)
            }
        }
        self.exact = exact
        self.parameterised = parameterised
    }

    func match(method: HTTPRequest.Method, path target: String) -> Match {
        let path = target.utf8.contains(UInt8(ascii: "?")) ? String(target[..<target.firstIndex(of: "?")!]) : target
        if let entry = self.exact[path] { return Self.pick(method, entry, parameter: nil) }
        // Canonical paths only (an empty or dot segment is a 404): a proxy rule guarding `/v1/admin/` sees every way in.
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        guard path.hasPrefix("/"), !segments.contains(where: { $0.isEmpty || $0 == "." || $0 == ".." }) else { return .notFound }
        for entry in self.parameterised where entry.segments.count == segments.count {
            var parameter: Substring?
            let matches = zip(entry.segments, segments).enumerated().allSatisfy { index, pair in
                if index == entry.parameterIndex {
                    parameter = pair.1
                    return true
                }
                return pair.0 == pair.1
            }
            if matches { return Self.pick(method, entry, parameter: parameter) }
        }
        return .notFound
    }

    private static func pick(_ method: HTTPRequest.Method, _ entry: Entry, parameter: Substring?) -> Match {
        for endpoint in entry.endpoints where endpoint.method == method {
            return .found(endpoint, parameter: parameter)
        }
        return .methodNotAllowed(entry.endpoints.map(\.method.rawValue))
    }
}

/// Requests in flight, for overload shedding; also `metricsd_http_requests_in_flight` on `/metrics`.
package final class InFlightCounter: Sendable {
    private let count = Atomic<Int>(0)
    private let gauge = Gauge(label: "metricsd_http_requests_in_flight")

    package init() {}

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
