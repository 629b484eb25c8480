import HTTPTypes
import MetricsdTracing
import NIOCore
import NIOHTTP1

/// Every HTTP/1.1 connection's last handler, behind NIO's server pipeline (`configureHTTPServerPipeline`: request
/// decoder, response encoder, `HTTPServerPipelineHandler`; parse errors are answered here): hands each request
/// to the ``APIDispatcher`` and writes its reply. The decisions are ``ConnectionStateMachine``'s; this class
/// performs them.
///
/// - Back-pressure: a reply's end is written only while the channel is writable; until then NIO's pipeline
///   handler neither reads nor delivers the next request, so no further reply is produced.
/// - Memory per connection, whatever the client does: one read of at most ``readLimit`` bytes (NIO's decoder
///   parses it whole; the pipeline handler keeps the parsed parts while a reply is pending: a few hundred bytes
///   per request in it, ~0.5 MB for 16 KiB of the smallest requests), one request body (16 KiB), and the reply
///   being written (the channel's 64 KiB high-water mark plus one reply; `/openapi.yaml` is one shared buffer).
/// - Deadlines: the first head must be whole within the request timeout of the connection's start, a body within
///   the request timeout of its head, the next head within the idle timeout of the last reply, and a reply the
///   client does not take (its end held, or a closing reply) within the write timeout. One timer per connection,
///   which looks again when it fires. Graceful shutdown closes an idle connection at once and a busy one after
///   its reply (NIO's pipeline handler), so the drain is bounded by these deadlines too.
final class HTTPConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// The most a single read takes from the socket (and NIO's decoder parses at once).
    static let readLimit = 16 * 1024

    /// The answer to bytes that are not HTTP/1.1 (this handler's, not `HTTPServerProtocolErrorHandler`'s, which
    /// would also answer the bytes after a request that closes the connection).
    static let badRequest = HTTPResponseHead(
        version: .http1_1, status: .badRequest,
        headers: HTTPHeaders([("Connection", "close"), ("Content-Length", "0")]))

    private let dispatcher: APIDispatcher
    private let worker: ConnectionWorker
    private let proxies: TrustedProxies
    /// `http`, or `https` on a TLS listener (`url.scheme` of the request spans).
    private let scheme: String
    /// The connection's remote address, described once.
    private var peer: TrustedProxies.Peer?
    /// What every request span of the connection says of it, found once (while tracing is on): whether the peer
    /// is a trusted proxy, and the listener's address and port.
    private var traceSide: (trusted: Bool, address: String?, port: Int?)?
    private var machine: ConnectionStateMachine
    /// Replies are written one at a time: a reply that becomes ready while another one's end is being written
    /// (NIO's pipeline handler delivers the next pipelined request from inside that write, and an immediate
    /// handler answers at once) waits here, so pipelined requests are answered in a loop, not by recursion.
    private var waitingReply: (Reply, String)?
    private var writing = false
    private var timer: Scheduled<Void>?
    private var context: ChannelHandlerContext?

    init(
        dispatcher: APIDispatcher, worker: ConnectionWorker, timeouts: HTTPTimeouts,
        proxies: TrustedProxies = TrustedProxies(),
        scheme: String = "http", now: NIODeadline
    ) {
        self.dispatcher = dispatcher
        self.worker = worker
        self.proxies = proxies
        self.scheme = scheme
        self.machine = ConnectionStateMachine(timeouts: timeouts, maxBodySize: APIDispatcher.maxBodySize, now: now)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.rearm(context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.timer?.cancel()
        self.timer = nil
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.machine.channelInactive()
        self.timer?.cancel()
        self.timer = nil
        self.worker.finish()
        context.fireChannelInactive()
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let now = context.eventLoop.now
        switch self.unwrapInboundIn(data) {
        case .head(let head): self.perform(self.machine.head(head, now: now), context: context)
        case .body(let chunk): self.perform(self.machine.body(chunk), context: context)
        case .end: self.perform(self.machine.end(), context: context)
        }
        self.rearm(context)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            self.perform(self.machine.inputClosed(), context: context)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is HTTPParserError {
            self.perform(self.machine.parseError(now: context.eventLoop.now), context: context)
            self.rearm(context)
        } else {
            // A reset, a broken pipe, or a misuse NIO's pipeline handler reports: nothing more can be said.
            context.close(promise: nil)
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        let isWritable = context.channel.isWritable
        switch self.machine.writabilityChanged(isWritable: isWritable, now: context.eventLoop.now) {
        case .none: break
        case .end: self.writeEnd(close: false, context: context)
        case .endAndClose: self.writeEnd(close: true, context: context)
        }
        self.rearm(context)
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        if self.machine.readsAllowed { context.read() }
    }

    private func perform(_ action: ConnectionStateMachine.Action, context: ChannelHandlerContext) {
        switch action {
        case .none:
            break
        case .dispatch(let head, let body):
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            var connection = ConnectionContext(
                eventLoop: context.eventLoop, worker: self.worker, client: self.client(of: head, context: context))
            if Traces.isEnabled { connection.trace = self.traceInput(of: head, context: context) }
            self.dispatcher.respond(to: head, body: body, connection: connection) { reply, requestID in
                bound.value.replyReady(reply, requestID: requestID)
            }
        case .refuse(let head, let refusal):
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            self.dispatcher.refuse(head, refusal, client: self.client(of: head, context: context)) { reply, requestID in
                bound.value.replyReady(reply, requestID: requestID)
            }
        case .sendContinue:
            context.writeAndFlush(
                self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .continue))), promise: nil)
        case .close:
            context.close(promise: nil)
        case .refuseUnparsable:
            // A channel already closed (NIO's decoder reports a request cut short when the connection closes, and
            // NIO's pipeline handler closes it on graceful shutdown) is not written to.
            guard context.channel.isActive else {
                context.close(promise: nil)
                return
            }
            context.write(self.wrapOutboundOut(.head(Self.badRequest)), promise: nil)
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
            self.closeAfterFlush(context: context)
        }
    }

    /// The request's client for the request log: the peer, or behind a trusted proxy the address it forwarded.
    private func client(of head: HTTPRequestHead, context: ChannelHandlerContext) -> String {
        let peer = self.peer ?? TrustedProxies.Peer(context.channel.remoteAddress)
        self.peer = peer
        guard !self.proxies.isEmpty else { return peer.text }
        let values = head.headers[self.proxies.header.rawValue]
        return self.proxies.client(peer: peer, forwarded: values.isEmpty ? nil : values.joined(separator: ", "))
    }

    /// What a request's server span is made from: the trace context a trusted proxy passed on (a client's own
    /// `traceparent` is ignored unless the peer is a trusted proxy: anyone could otherwise choose to be sampled, and
    /// make every statement of their requests unique), the scheme and the listener's port.
    private func traceInput(of head: HTTPRequestHead, context: ChannelHandlerContext) -> RequestTraceInput {
        let side = self.traceSide ?? self.describeTraceSide(context)
        return RequestTraceInput(
            traceParent: side.trusted ? head.headers.first(name: "traceparent") : nil,
            traceState: side.trusted ? Self.joined(head.headers["tracestate"]) : nil,
            scheme: self.scheme, host: head.headers.first(name: "host"), localAddress: side.address,
            localPort: side.port)
    }

    private func describeTraceSide(_ context: ChannelHandlerContext) -> (trusted: Bool, address: String?, port: Int?) {
        let peer = self.peer ?? TrustedProxies.Peer(context.channel.remoteAddress)
        self.peer = peer
        let local = context.channel.localAddress
        let side = (
            trusted: peer.bytes.map { self.proxies.trusts($0) } ?? false, address: local?.ipAddress, port: local?.port
        )
        self.traceSide = side
        return side
    }

    private static func joined(_ values: [String]) -> String? {
        values.isEmpty ? nil : values.joined(separator: ",")
    }

    // MARK: Outbound

    private func replyReady(_ reply: Reply, requestID: String) {
        guard let context = self.context else { return }
        self.waitingReply = (reply, requestID)
        guard !self.writing else { return }  // the loop below, further up the stack, takes it
        self.writing = true
        defer { self.writing = false }
        while let (reply, requestID) = self.waitingReply {
            self.waitingReply = nil
            let plan =
                reply.stream == nil
                ? self.machine.replyReady(isWritable: context.channel.isWritable, now: context.eventLoop.now)
                : self.machine.streamReady(now: context.eventLoop.now)
            self.rearm(context)
            guard plan.action != .discard else { continue }
            let head = reply.head(
                requestID: requestID, close: plan.action == .writeAndClose, keepAlive: plan.announcesKeepAlive)
            context.write(self.wrapOutboundOut(.head(head)), promise: nil)
            if let stream = reply.stream, !plan.bodyless {
                context.flush()
                self.startStream(stream, context: context)
                continue
            }
            if !plan.bodyless, reply.body.readableBytes > 0 {
                context.write(self.wrapOutboundOut(.body(.byteBuffer(reply.body))), promise: nil)
            }
            switch plan.action {
            case .writeAndEnd:
                // NIO's pipeline handler may deliver the next request from inside this write.
                context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
            case .writeAndHold:
                context.flush()
            case .writeAndClose:
                context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
                self.closeAfterFlush(context: context)
            case .discard:
                break
            }
        }
    }

    /// Runs a streamed body's producer in the connection's task; its parts are written here, on the event loop.
    private func startStream(_ stream: BodyStream, context: ChannelHandlerContext) {
        let eventLoop = context.eventLoop
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let writer = BodyWriter { part in
            try await eventLoop.flatSubmit { bound.value.writePart(part, on: eventLoop) }.get()
        }
        let accepted = self.worker.submit {
            let finished: Bool
            do {
                try await stream.produce(writer)
                finished = true
            } catch {
                finished = false
            }
            eventLoop.execute { bound.value.endStream(finished: finished) }
        }
        if !accepted { context.close(promise: nil) }
    }

    private func writePart(_ part: ByteBuffer, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        guard let context = self.context, context.channel.isActive else {
            return eventLoop.makeFailedFuture(ChannelError.ioOnClosedChannel)
        }
        self.machine.streamed(now: context.eventLoop.now)
        let promise = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(self.wrapOutboundOut(.body(.byteBuffer(part))), promise: promise)
        return promise.futureResult
    }

    /// The producer is done: the body's end and the connection's, or (it failed) the connection's alone.
    private func endStream(finished: Bool) {
        guard let context = self.context else { return }
        guard finished, context.channel.isActive else {
            context.close(promise: nil)
            return
        }
        context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        self.closeAfterFlush(context: context)
    }

    private func writeEnd(close: Bool, context: ChannelHandlerContext) {
        self.writing = true
        context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        self.writing = false
        if close {
            self.closeAfterFlush(context: context)
        } else if let (reply, requestID) = self.waitingReply {
            self.waitingReply = nil
            self.replyReady(reply, requestID: requestID)
        }
    }

    /// Shuts the output down once everything written is flushed (the client gets every reply and then end of
    /// input), then closes. The closing state's deadline closes at once if the client never takes the bytes.
    private func closeAfterFlush(context: ChannelHandlerContext) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        let promise = context.eventLoop.makePromise(of: Void.self)
        promise.futureResult.whenComplete { _ in bound.value.close(promise: nil) }
        context.close(mode: .output, promise: promise)
    }

    // MARK: Deadlines

    /// Makes sure the timer fires by the state's deadline. The timer fires at the deadline or after the
    /// shortest timeout, whichever comes first; every deadline is at least that far away when it is set, so a
    /// timer already scheduled is never late and a request never has to move it.
    private func rearm(_ context: ChannelHandlerContext) {
        guard self.timer == nil, let deadline = self.machine.deadline else { return }
        let timeouts = self.machine.timeouts
        let shortest = min(timeouts.request, timeouts.idle, timeouts.write)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        self.timer = context.eventLoop.scheduleTask(deadline: min(deadline, context.eventLoop.now + shortest)) {
            let (handler, context) = bound.value
            handler.timer = nil
            let action = handler.machine.timerFired(now: context.eventLoop.now)
            handler.perform(action, context: context)
            handler.rearm(context)
        }
    }
}

extension Reply {
    /// The response head: status, `Content-Type` (JSON unless the reply names another), `Content-Length` (the
    /// body's, also for HEAD; neither for a 304), `X-Request-Id`, `Date`, `Connection: close` when the connection
    /// ends after it
    /// (`keep-alive` for an HTTP/1.0 client that asked), then the reply's own headers.
    func head(requestID: String, close: Bool, keepAlive: Bool) -> HTTPResponseHead {
        var headers = HTTPHeaders()
        headers.reserveCapacity(6 + self.headers.count)
        // A 304 has no content: neither its type nor a length (which would have to be the 200's, RFC 9110 §8.6).
        if self.status != .notModified {
            headers.add(name: "Content-Type", value: self.headers[.contentType] ?? "application/json")
            // A streamed body's length is not known before it is written: NIO sends it chunked.
            if self.stream == nil { headers.add(name: "Content-Length", value: String(self.body.readableBytes)) }
        }
        headers.add(name: "X-Request-Id", value: requestID)
        headers.add(name: "Date", value: HTTPDate.now())
        if close {
            headers.add(name: "Connection", value: "close")
        } else if keepAlive {
            headers.add(name: "Connection", value: "keep-alive")
        }
        for field in self.headers where field.name != .contentType {
            headers.add(name: field.name.rawName, value: field.value)
        }
        return HTTPResponseHead(
            version: .http1_1,
            status: HTTPResponseStatus(statusCode: Int(self.status.code), reasonPhrase: self.status.reasonPhrase),
            headers: headers)
    }
}
