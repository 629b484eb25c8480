import CoreMetrics
import HTTPTypes
import HealthMetrics
import Logging
import MetricsdTracing
import NIOCore
import NIOHTTP1
import Synchronization
import Tracing

/// Where a connection's work runs: its event loop, and its own task; and who the request is from.
package struct ConnectionContext: Sendable {
    let eventLoop: any EventLoop
    let worker: ConnectionWorker
    /// The client's address for the request log (``TrustedProxies``).
    var client: String = ""
    /// What the request's server span is made from; nil while tracing is off.
    var trace: RequestTraceInput?
}

/// The one path every HTTP request takes, whatever its route.
///
/// In order: the request id; the route (404, 405 with `Allow`, 501 for CONNECT; HEAD is answered as GET); the
/// in-flight limit (a fast 503 with `Retry-After` instead of a queue); authentication (401 with
/// `WWW-Authenticate`); the endpoint's handler; errors mapped to `{"error": …, "statusCode": …, "code": …}` (an
/// unexpected one is a 500 naming the request id, its detail logged); then the `metricsd_http_*` metrics and the request log
/// line. The reply is handed back on the connection's event loop; the connection adds the common headers.
///
/// The busiest request, `GET /v1/profile/metrics/today`, is answered without a task: the token is checked on the
/// event loop and the database read is a callback (`Endpoint.Handler.callback`). Work that takes longer, or
/// waits, runs in the connection's own task (``ConnectionWorker``): async handlers and the rest of a callback
/// that needs one. That is why this dispatcher is not Hummingbird's router (which runs every request in a task
/// behind an async sequence): on this project's 2-core benchmark the router alone topped out below the
/// database's own read ceiling (README, Performance).
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

    /// The answer to one whole request, handed to `completion` on the connection's event loop with the request
    /// id: exactly once, unless the server is torn down first (its task cancelled).
    func respond(
        to head: HTTPRequestHead, body: ByteBuffer, connection: ConnectionContext,
        completion: @escaping (Reply, String) -> Void
    ) {
        let started = ContinuousClock.now
        let fields = RequestFields(head.headers)
        let method = HTTPRequest.Method(head.method)
        let requestID = Self.requestID(from: fields.requestID)
        let finish = Finish(
            dispatcher: self, method: method, requestID: requestID, client: connection.client, started: started,
            span: connection.trace.flatMap { RequestTracing.start(method: method, input: $0) }, completion: completion)
        let endpoint: Endpoint
        let parameter: Substring?
        switch self.routes.match(method: method, target: head.uri) {
        case .found(let found, let value):
            endpoint = found
            parameter = value
        case .methodNotAllowed(let allowed):
            var error = AppError(.methodNotAllowed, .methodNotAllowed, "method \(method.rawValue) is not allowed here")
            error.headers[.allow] = allowed.joined(separator: ", ")
            finish(.error(error), route: "unmatched", userID: nil)
            return
        case .notImplemented:
            finish(
                .error(AppError(.notImplemented, .methodNotImplemented, "method \(method.rawValue) is not supported")),
                route: "unmatched", userID: nil)
            return
        case .notFound:
            let shown = Self.shownPath(RouteTable.path(of: head.uri))
            finish(
                .error(AppError(.notFound, .routeNotFound, "no such route: \(method.rawValue) \(shown)")),
                route: "unmatched", userID: nil)
            return
        }
        guard self.inFlight.enter(limit: self.maxInFlight) else {
            finish(.error(AppError.unavailable(.busy, "server busy, retry shortly")), route: "shed", userID: nil)
            return
        }
        var request = EndpointRequest(
            head: head, body: body, parameter: parameter, ifNoneMatch: fields.ifNoneMatch, requestID: requestID,
            eventLoop: connection.eventLoop, logger: self.logger)
        do throws(AppError) {
            switch endpoint.access {
            case .open: break
            case .user:
                let token = try bearerToken(fields.authorization)
                let tokens = self.credentials.current.tokens
                guard tokens.checksQuickly(token) else {
                    self.verifyElsewhere(token, with: tokens, endpoint, request, finish: finish, connection: connection)
                    return
                }
                request.userID = try self.verifiedUser(token, with: tokens, requestID: requestID)
            case .admin:
                let token = try bearerToken(fields.authorization)
                guard let check = self.credentials.current.admin, check.matches(token) else {
                    Self.requestLogger(self.logger, requestID: requestID, userID: nil).notice("Admin token refused")
                    throw AppError.unauthorized(.adminTokenInvalid, "invalid admin token")
                }
            }
        } catch {
            self.inFlight.leave()
            finish(.error(error), route: endpoint.route, userID: nil)
            return
        }
        self.run(endpoint, request, finish: finish, connection: connection)
    }

    /// The endpoint's handler, once the request passed routing, the in-flight limit and authentication; on the
    /// connection's event loop.
    private func run(_ endpoint: Endpoint, _ request: EndpointRequest, finish: Finish, connection: ConnectionContext) {
        let done = Done(
            dispatcher: self, finish: NIOLoopBound(finish, eventLoop: connection.eventLoop), route: endpoint.route,
            request: request, caching: endpoint.caching, trace: finish.span?.context)
        // Traced, the handler runs with the request's span as the current context (bound on this thread for the
        // callback handlers, which start their work here; ``later(_:done:connection:)`` binds it in the task, also
        // when a callback hands its rest over from another thread).
        guard let span = finish.span else {
            self.handle(endpoint, request: request, done: done, connection: connection)
            return
        }
        ServiceContext.$current.withValue(span.context) {
            self.handle(endpoint, request: request, done: done, connection: connection)
        }
    }

    private func handle(_ endpoint: Endpoint, request: EndpointRequest, done: Done, connection: ConnectionContext) {
        let requestID = request.requestID
        let user = request.userID
        switch endpoint.handler {
        case .callback(let handle):
            handle(request) { answer in
                switch answer {
                case .reply(let reply): done(reply)
                case .failure(let error): done(self.errorReply(error, requestID: requestID, userID: user))
                case .later(let rest): self.later(rest, done: done, connection: connection)
                }
            }
        case .async(let handle):
            self.later({ try await handle(request) }, done: done, connection: connection)
        }
    }

    /// A token whose check would hold the event loop (an asymmetric signature: ES256, EdDSA, RS256 take tens to
    /// hundreds of microseconds, an HS256 MAC about one) is checked in the connection's task; the request then
    /// goes on from the event loop as any other (scripts/bench, step eventloop).
    private func verifyElsewhere(
        _ token: Substring, with tokens: TokenVerifier, _ endpoint: Endpoint, _ request: EndpointRequest,
        finish: Finish, connection: ConnectionContext
    ) {
        let bound = NIOLoopBound(finish, eventLoop: connection.eventLoop)
        let accepted = connection.worker.submit {
            let verified = Result { () throws(AppError) -> Int64 in
                try self.verifiedUser(token, with: tokens, requestID: request.requestID)
            }
            connection.eventLoop.execute {
                switch verified {
                case .success(let userID):
                    var request = request
                    request.userID = userID
                    self.run(endpoint, request, finish: bound.value, connection: connection)
                case .failure(let error):
                    self.inFlight.leave()
                    bound.value(.error(error), route: endpoint.route, userID: nil)
                }
            }
        }
        // The connection closed before: nobody waits for the reply, but the in-flight slot is given back.
        if !accepted {
            self.inFlight.leave()
            finish(
                .error(AppError.unavailable(.connectionClosed, "connection closed")), route: endpoint.route, userID: nil
            )
        }
    }

    /// A request the connection answers before reading its body (over the size limit, an unknown expectation);
    /// `completion` runs at once.
    func refuse(
        _ head: HTTPRequestHead, _ refusal: ConnectionStateMachine.Refusal, client: String,
        completion: @escaping (Reply, String) -> Void
    ) {
        let method = HTTPRequest.Method(head.method)
        let requestID = Self.requestID(from: RequestFields(head.headers).requestID)
        let finish = Finish(
            dispatcher: self, method: method, requestID: requestID, client: client, started: .now,
            completion: completion)
        switch refusal {
        case .bodyTooLarge:
            finish(
                .error(AppError(.contentTooLarge, .bodyTooLarge, "request body is larger than 16 KiB")),
                route: "too_large", userID: nil)
        case .expectationFailed:
            finish(
                .error(
                    AppError(.expectationFailed, .expectationFailed, "only the expectation 100-continue is supported")),
                route: "unmatched", userID: nil)
        }
    }

    /// Runs the rest of a request in the connection's task; its reply goes back to the event loop.
    private func later(_ work: @escaping @Sendable () async throws -> Reply, done: Done, connection: ConnectionContext)
    {
        let trace = done.trace
        let accepted = connection.worker.submit {
            let reply: Reply
            do {
                if let trace {
                    reply = try await ServiceContext.$current.withValue(trace) { try await work() }
                } else {
                    reply = try await work()
                }
            } catch {
                reply = self.errorReply(error, requestID: done.request.requestID, userID: done.request.userID)
            }
            done(reply)
        }
        // The connection closed before: nobody waits for the reply, but the in-flight slot is given back.
        if !accepted { done(.error(AppError.unavailable(.connectionClosed, "connection closed"))) }
    }

    /// The end of a request that passed the in-flight limit: gives its slot back, then ``Finish``; on the
    /// connection's event loop whichever thread the reply comes from.
    private struct Done: Sendable {
        let dispatcher: APIDispatcher
        let finish: NIOLoopBound<Finish>
        let route: String
        let request: EndpointRequest
        let caching: CachePolicy
        /// The request's span context while tracing is on (for the rest of the work, wherever it runs).
        let trace: ServiceContext?

        func callAsFunction(_ reply: Reply) {
            let eventLoop = self.finish.eventLoop
            if eventLoop.inEventLoop {
                self.dispatcher.inFlight.leave()
                self.finish.value(
                    reply, route: self.route, userID: self.request.userID, caching: self.caching,
                    ifNoneMatch: self.request.ifNoneMatch)
            } else {
                eventLoop.execute {
                    self.dispatcher.inFlight.leave()
                    self.finish.value(
                        reply, route: self.route, userID: self.request.userID, caching: self.caching,
                        ifNoneMatch: self.request.ifNoneMatch)
                }
            }
        }
    }

    /// Completes a request: its caching headers (and a `304` for a matching `If-None-Match`, ``CachePolicy``),
    /// metrics, the request log line, then the connection's writer (which adds the common headers as it writes the
    /// reply). Replies that never reached an endpoint (404, 405, 413, 503 shed) are errors: never stored.
    private struct Finish {
        let dispatcher: APIDispatcher
        let method: HTTPRequest.Method
        let requestID: String
        let client: String
        let started: ContinuousClock.Instant
        /// The request's server span, while tracing is on.
        var span: MetricsdSpan? = nil
        let completion: (Reply, String) -> Void

        func callAsFunction(
            _ reply: Reply, route: String, userID: Int64?, caching: CachePolicy = .noStore, ifNoneMatch: [String]? = nil
        ) {
            var reply = reply
            caching.prepare(&reply, method: self.method, ifNoneMatch: ifNoneMatch)
            let status = reply.status.code
            if let span = self.span,
                let traceParent = RequestTracing.finish(span, method: self.method, route: route, status: status)
            {
                reply.headers[RequestTracing.traceParentField] = traceParent
            }
            HTTPMetrics.record(route: route, method: self.method, status: status, since: self.started)
            self.dispatcher.requestLog.record(
                method: self.method, route: route, status: status, started: self.started, userID: userID,
                requestID: self.requestID, client: self.client, errorCode: reply.errorCode)
            self.completion(reply, self.requestID)
        }
    }

    // MARK: Authentication

    /// The user id (`sub`) of a bearer token, or the 401 to answer, its reason logged at debug level.
    func verifiedUser(_ token: Substring, with tokens: TokenVerifier, requestID: String) throws(AppError) -> Int64 {
        do {
            return try tokens.verify(token)
        } catch {
            let logger = Self.requestLogger(self.logger, requestID: requestID, userID: nil)
            logger.debug(
                "Token refused",
                metadata: ["metricsd.reason": "\(error.message)", "metricsd.error.code": "\(error.errorCode)"])
            throw AppError.unauthorized(.token(error.reason), error.message)
        }
    }

    // MARK: Errors

    /// The reply to an error a handler threw, logged when it is the server's fault.
    func errorReply(_ error: any Error, requestID: String, userID: Int64?) -> Reply {
        .error(
            Self.appError(
                for: error, logger: Self.requestLogger(self.logger, requestID: requestID, userID: userID),
                requestID: requestID))
    }

    /// What the client is told about an error; logged when it is the server's fault (never with details in the
    /// answer: a 500 names only the request id, the log line has the rest).
    static func appError(for error: any Error, logger: Logger, requestID: String) -> AppError {
        switch error {
        case let error as AppError:
            if error.status.code >= 500 {
                logger.warning("Request failed", metadata: .errorFields(error.message, code: error.errorCode))
            }
            return error
        case let error as any ClientFacingError where error.clientError != nil:
            logger.warning("Request failed", metadata: .errorFields(error))
            return error.clientError!
        default:
            // The log line carries the failure's own code when it has one, else the 500's.
            let code = (error as? any CodedError)?.errorCode ?? AppError.Code.internalError.rawValue
            logger.error("Unhandled error", metadata: .errorFields(String(reflecting: error), code: code))
            return AppError(.internalServerError, .internalError, "internal server error (request \(requestID))")
        }
    }
}
