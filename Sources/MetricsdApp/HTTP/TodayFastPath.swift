import Foundation
import Glibc
import HTTPTypes
import HealthMetrics
import Hummingbird
import Logging
import NIOCore
import NIOHTTPTypes
import Synchronization

/// What `GET /v1/profile/metrics/today` needs outside the router: shared with it, so both answer alike.
public final class TodayEndpoint: Sendable {
    static let path = "/v1/profile/metrics/today"

    let store: any MetricsStore
    let credentials: CredentialBox
    let inFlight: InFlightCounter
    let maxInFlight: Int
    let logger: Logger

    init(store: any MetricsStore, credentials: CredentialBox, inFlight: InFlightCounter, maxInFlight: Int, logger: Logger) {
        self.store = store
        self.credentials = credentials
        self.inFlight = inFlight
        self.maxInFlight = maxInFlight
        self.logger = logger
    }
}

/// The hot path: answers `GET /v1/profile/metrics/today` on the connection's event loop, without the router.
///
/// The app's busiest request is one token check and one indexed read. Through Hummingbird's router every request
/// also pays for a task resumption, an async-sequence element, a `Request`/`Response` pair, a router lookup and
/// three middleware frames: on 2 cores that was more CPU than the read itself (README "Performance"). This
/// handler sits at the end of the NIO pipeline, after the deadline and connection-state handlers (so idle
/// timeouts, keep-alive and graceful shutdown see every request) and before Hummingbird's async channel, and
/// answers the request itself with exactly what the route would: the same token check (`CredentialBox`), the
/// same batched read (`MetricsStore.latestMetrics(userID:completion:)` → `LatestMetricsBatcher`), the same body
/// (`ProfileMetricsController.todayBody`), the same in-flight limit, request id, `Date`, error bodies and
/// logging (`EdgeMiddleware.appError`), and the same `metricsd_http_*` metrics. A user without metrics yet takes
/// the route's own async code (`ProfileMetricsController.computeNowBody`).
///
/// Everything else passes through untouched: other routes and methods, a query string, a request with a body or
/// `Connection: close` (the router serves those with the same code). Responses leave in request order: a hot
/// request waits while an earlier one is with the router; later requests, a parse error and the end of input
/// wait while a hot request is answered; reading stops while more than a few parts wait (`maxHeldParts`).
final class TodayFastPath: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let endpoint: TodayEndpoint
    private let eventLoop: any EventLoop
    /// A hot request being answered (from its head until its response is written).
    private var busy = false
    /// Requests passed to the router whose responses have not ended yet.
    private var withRouter = 0
    /// The request whose parts go to the router (from its head to its end).
    private var forwarding = false
    /// Parts (and the input-closed event, and a parse error) held back to keep responses in order.
    private var held = CircularBuffer<HTTPRequestPart>()
    private var heldInputClosed = false
    private var heldError: (any Error)?
    /// A `read()` held back while too many parts wait (back-pressure).
    private var readPending = false
    /// The hot request until its end has arrived.
    private var hot: (head: HTTPRequest, started: ContinuousClock.Instant)?
    private var resuming = false
    /// Parts passed on to the router so far.
    private var passedOn = 0
    /// This handler's context while it is in the pipeline (answers arrive later, from other threads).
    private var context: ChannelHandlerContext?

    init(endpoint: TodayEndpoint, eventLoop: any EventLoop) {
        self.endpoint = endpoint
        self.eventLoop = eventLoop
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = self.unwrapInboundIn(data)
        if self.hot == nil, self.busy || !self.held.isEmpty || self.mustWait(part) {
            self.held.append(part)
        } else {
            self.process(part, context: context)
        }
    }

    /// A hot request behind requests still with the router waits for their responses.
    private func mustWait(_ part: HTTPRequestPart) -> Bool {
        guard case .head(let head) = part else { return false }
        return self.withRouter > 0 && Self.isHot(head)
    }

    /// Handles one part in order (never one that `mustWait`).
    private func process(_ part: HTTPRequestPart, context: ChannelHandlerContext) {
        switch part {
        case .head(let head):
            if Self.isHot(head) {
                self.busy = true
                self.hot = (head, ContinuousClock.now)
            } else {
                self.withRouter += 1
                self.forwarding = true
                self.passOn(part, context: context)
            }
        case .body:
            // A hot request has no body (`isHot`), so body parts belong to a forwarded request.
            if self.forwarding { self.passOn(part, context: context) }
        case .end:
            if self.forwarding {
                self.forwarding = false
                self.passOn(part, context: context)
            } else if let hot = self.hot {
                self.hot = nil
                self.answer(hot.head, started: hot.started, context: context)
            }
        }
    }

    private func passOn(_ part: HTTPRequestPart, context: ChannelHandlerContext) {
        self.passedOn &+= 1
        context.fireChannelRead(self.wrapInboundOut(part))
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The client closed its side after its last request: the router must not see that before the requests
        // held here, or it would end the connection under them.
        if let event = event as? ChannelEvent, event == .inputClosed, self.busy || !self.held.isEmpty {
            self.heldInputClosed = true
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A parse error after requests still held or answered here: the router answers it (400, close) only once
        // they are, as it would have in request order.
        if self.busy || !self.held.isEmpty {
            if self.heldError == nil { self.heldError = error }
            return
        }
        context.fireErrorCaught(error)
    }

    /// Whether the request is one this handler answers: exactly `GET /v1/profile/metrics/today`, no body, no
    /// `Connection: close`.
    static func isHot(_ head: HTTPRequest) -> Bool {
        guard head.method == .get, head.path == TodayEndpoint.path else { return false }
        for field in head.headerFields {
            switch field.name {
            case .contentLength, .transferEncoding: return false
            case .connection where field.value.lowercased().contains("close"): return false
            default: continue
            }
        }
        return true
    }

    // MARK: Outbound

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        // Only the router's responses pass here (this handler writes its own from its context, past itself).
        if case .end = self.unwrapOutboundIn(data) {
            context.write(data, promise: promise)
            self.withRouter -= 1
            if self.withRouter == 0 { self.resume(context: context) }
            return
        }
        context.write(data, promise: promise)
    }

    func read(context: ChannelHandlerContext) {
        // Reading goes on while one request is answered (stopping and restarting it costs two epoll_ctl calls
        // per request); a client that sends more than a few requests ahead is not read from until they are done.
        if self.held.count >= Self.maxHeldParts {
            self.readPending = true
        } else {
            context.read()
        }
    }

    /// Parts held before reading stops (a few pipelined requests).
    static let maxHeldParts = 16

    // MARK: Answering

    private func answer(_ head: HTTPRequest, started: ContinuousClock.Instant, context: ChannelHandlerContext) {
        let endpoint = self.endpoint
        var authorization: String?
        var clientRequestID: String?
        for field in head.headerFields {
            if field.name == .authorization {
                authorization = authorization.map { $0 + ", " + field.value } ?? field.value
            } else if field.name == .requestID {
                clientRequestID = clientRequestID.map { $0 + ", " + field.value } ?? field.value
            }
        }
        let requestID = EdgeMiddleware.requestID(from: clientRequestID)
        guard endpoint.inFlight.enter(limit: endpoint.maxInFlight) else {
            let error = AppError.unavailable("server busy, retry shortly")
            self.finish(.error(error), route: "shed", requestID: requestID, started: started, context: context)
            return
        }
        let userID: Int64
        do {
            userID = try authenticatedUser(
                authorization, credentials: endpoint.credentials, logger: Self.logger(endpoint, requestID, nil))
        } catch {
            endpoint.inFlight.leave()
            self.finish(.error(error), route: TodayEndpoint.path, requestID: requestID, started: started, context: context)
            return
        }
        let loop = self.eventLoop
        let bound = NIOLoopBound(self, eventLoop: loop)
        endpoint.store.latestMetrics(userID: userID) { result in
            let outcome: Outcome
            switch result {
            case .success(.some(let latest)): outcome = .metrics(latest)
            case .success(.none): outcome = .computeNow(userID)
            case .failure(let error): outcome = .failure(error)
            }
            loop.execute {
                bound.value.completed(outcome, requestID: requestID, started: started)
            }
        }
    }

    private enum Outcome: Sendable {
        /// Written on the event loop: the batch's thread goes on to the next batch at once.
        case metrics(LatestMetrics)
        case body(String)
        case computeNow(Int64)
        case failure(any Error)
        case error(AppError)
    }

    private func completed(_ outcome: Outcome, requestID: String, started: ContinuousClock.Instant) {
        guard case .computeNow(let userID) = outcome else {
            self.endpoint.inFlight.leave()
            self.finish(outcome, route: TodayEndpoint.path, requestID: requestID, started: started, context: self.context)
            return
        }
        // A user with valid settings and no row yet (just onboarded): the route's own code computes it now.
        let endpoint = self.endpoint
        let loop = self.eventLoop
        let bound = NIOLoopBound(self, eventLoop: loop)
        Task {
            let outcome = await TodayFastPath.computeNow(userID: userID, endpoint: endpoint, requestID: requestID)
            loop.execute {
                endpoint.inFlight.leave()
                let handler = bound.value
                handler.finish(outcome, route: TodayEndpoint.path, requestID: requestID, started: started, context: handler.context)
            }
        }
    }

    private static func computeNow(userID: Int64, endpoint: TodayEndpoint, requestID: String) async -> Outcome {
        do {
            return .body(
                try await ProfileMetricsController.computeNowBody(
                    userID: userID, store: endpoint.store, logger: Self.logger(endpoint, requestID, userID)))
        } catch {
            return .failure(error)
        }
    }

    /// The request's logger, as the router's would be (made only when something is logged).
    private static func logger(_ endpoint: TodayEndpoint, _ requestID: String, _ userID: Int64?) -> Logger {
        var logger = EdgeMiddleware.requestLogger(endpoint.logger, requestID: requestID)
        if let userID { logger[metadataKey: "metricsd.user.id"] = .stringConvertible(userID) }
        return logger
    }

    /// Writes the response, records the request's metrics, and goes on with held requests.
    private func finish(
        _ outcome: Outcome, route: String, requestID: String, started: ContinuousClock.Instant,
        context: ChannelHandlerContext?
    ) {
        var fields: HTTPFields
        let status: HTTPResponse.Status
        let body: String
        switch outcome {
        case .metrics(let latest):
            status = .ok
            fields = [:]
            body = ProfileMetricsController.todayBody(latest)
        case .body(let text):
            status = .ok
            fields = [:]
            body = text
        case .error(let error):
            status = error.status
            fields = error.headers
            body = error.body
        case .failure(let error):
            let error = EdgeMiddleware.appError(
                for: error, logger: Self.logger(self.endpoint, requestID, nil), requestID: requestID)
            status = error.status
            fields = error.headers
            body = error.body
        case .computeNow:
            preconditionFailure("computeNow is resolved before finishing")
        }
        fields[.contentType] = "application/json"
        fields[.contentLength] = String(body.utf8.count)
        fields[.requestID] = requestID
        fields[.date] = HTTPDate.now()
        self.busy = false
        HTTPMetrics.record(route: route, method: .get, status: status.code, since: started)
        // The context is gone only when the channel is (the handler left the pipeline): nothing to write to.
        guard let context else { return }
        if context.channel.isActive {
            context.write(self.wrapOutboundOut(.head(HTTPResponse(status: status, headerFields: fields))), promise: nil)
            context.write(self.wrapOutboundOut(.body(ByteBuffer(string: body))), promise: nil)
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        }
        self.resume(context: context)
    }

    /// Goes on with held parts once nothing is in the way; then lets reading continue. Re-entered when a held
    /// request is answered at once (a 401): the outer call carries on.
    private func resume(context: ChannelHandlerContext) {
        guard context.channel.isActive, !self.resuming else { return }
        self.resuming = true
        defer { self.resuming = false }
        let passedOn = self.passedOn
        while !self.busy || self.hot != nil, let part = self.held.first, self.hot != nil || !self.mustWait(part) {
            self.held.removeFirst()
            self.process(part, context: context)
        }
        // Hummingbird's async channel hands reads over on read-complete: parts passed on late need one too.
        if self.passedOn != passedOn { context.fireChannelReadComplete() }
        if self.readPending, self.held.count < Self.maxHeldParts {
            self.readPending = false
            context.read()
        }
        guard !self.busy, self.held.isEmpty else { return }
        if let error = self.heldError {
            self.heldError = nil
            context.fireErrorCaught(error)
        }
        if self.heldInputClosed {
            self.heldInputClosed = false
            context.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        }
    }
}

/// The `Date` header's value (IMF-fixdate), formatted once a second.
enum HTTPDate {
    private static let cache = Mutex<(second: Int, text: String)>((-1, ""))

    static func now() -> String {
        var seconds = time(nil)
        let second = Int(seconds)
        if let cached = Self.cache.withLock({ $0.second == second ? $0.text : nil }) { return cached }
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let text =
            "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
        Self.cache.withLock { $0 = (second, text) }
        return text
    }
}
