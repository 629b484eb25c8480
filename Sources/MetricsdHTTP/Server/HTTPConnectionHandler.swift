import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1

/// Every HTTP/1.1 connection's handler, after NIO's request decoder: reads each request (head, body up to 16 KiB,
/// end), hands it to the ``APIDispatcher``, and writes the reply as one buffer.
///
/// - Order: requests are answered one at a time, in the order they arrived. Parts that arrive while a reply is
///   pending (pipelining), the end of input (a client that half-closed after its last request) and a parse
///   error wait until the replies before them are written. Reading goes on while one request is answered
///   (stopping and restarting it would cost two `epoll_ctl` calls per request); a client that sends more than a
///   few requests ahead is not read from until they are answered (`maxHeldParts`).
/// - Deadlines (slow clients): the first request's head must arrive within `requestTimeout` of the connection
///   opening, a body within `requestTimeout` of its head, and the next head within `idleTimeout` of the last
///   reply; otherwise the connection is closed. One timer per connection, which looks again when it fires.
/// - Closing: after a reply when the request did not ask to keep the connection (`Connection: close`, or
///   HTTP/1.0 without keep-alive), after a body over the limit (the rest of it is never read), and when the
///   server shuts down gracefully (at once when idle, else after the replies to what arrived).
///
/// This replaces a chain of packaged handlers (HTTPTypes conversion both ways, NIO's response encoder,
/// Hummingbird's connection-state handler): on the benchmark's busiest request those layers cost about a tenth
/// of the machine's CPU between them, converting every head and header twice. NIO's decoder still parses
/// every request; only writing a status line and headers is done here.
final class HTTPConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Parts held before reading stops (a few pipelined requests).
    static let maxHeldParts = 16

    private let dispatcher: APIDispatcher
    private let requestTimeout: TimeAmount
    private let idleTimeout: TimeAmount

    /// The request being read, and its body so far.
    private var reading: HTTPRequestHead?
    private var body: ByteBuffer?
    /// The rest of the current request (a body over the limit) is dropped as it arrives.
    private var dropping = false
    /// A request was handed to the dispatcher and its reply is not written yet.
    private var answering = false
    /// Close the connection once the pending reply is written.
    private var closeAfterReply = false
    /// The server is shutting down: close as soon as nothing is pending.
    private var quiescing = false
    /// Parts (and the end of input, and a parse error) that wait for the pending reply.
    private var held = CircularBuffer<HTTPServerRequestPart>()
    private var heldInputClosed = false
    private var heldError: (any Error)?
    /// A `read()` held back while too many parts wait.
    private var readPending = false
    private var resuming = false
    /// When the connection is closed unless something happens first; nil while a request is worked on.
    private var deadline: NIODeadline?
    private var timer: Scheduled<Void>?
    /// This handler's context while it is in the pipeline (replies arrive later).
    private var context: ChannelHandlerContext?

    init(dispatcher: APIDispatcher, requestTimeout: TimeAmount, idleTimeout: TimeAmount) {
        self.dispatcher = dispatcher
        self.requestTimeout = requestTimeout
        self.idleTimeout = idleTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive { self.arm(context, self.requestTimeout) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.disarm()
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        self.arm(context, self.requestTimeout)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.disarm()
        context.fireChannelInactive()
    }

    // MARK: Reading

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = self.unwrapInboundIn(data)
        // Deadlines follow what arrives, whether it is handled now or held.
        switch part {
        case .head: self.arm(context, self.requestTimeout)  // its body must follow in time
        case .body: break
        case .end: self.deadline = nil  // the request is in; the server works on it
        }
        if self.answering || !self.held.isEmpty {
            self.held.append(part)
        } else {
            self.process(part, context: context)
        }
    }

    private func process(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        switch part {
        case .head(let head):
            self.reading = head
            self.body = nil
            self.dropping = false
            // A declared body over the limit is refused at once, before any of it is read.
            if let declared = head.headers.first(name: "content-length").flatMap({ Int($0) }),
                declared > APIDispatcher.maxBodySize
            {
                self.dispatchTooLarge(context: context)
            }
        case .body(var chunk):
            guard !self.dropping, self.reading != nil else { return }
            if self.body == nil {
                self.body = chunk
            } else {
                self.body!.writeBuffer(&chunk)
            }
            if self.body!.readableBytes > APIDispatcher.maxBodySize { self.dispatchTooLarge(context: context) }
        case .end:
            if self.dropping {
                self.dropping = false
                return
            }
            guard let head = self.reading else { return }
            self.reading = nil
            let body = self.body ?? ByteBuffer()
            self.body = nil
            self.dispatch(head, body: body, tooLarge: false, context: context)
        }
    }

    /// Answers 413 now; the rest of the body is dropped and the connection closed after the reply.
    private func dispatchTooLarge(context: ChannelHandlerContext) {
        guard let head = self.reading else { return }
        self.reading = nil
        self.body = nil
        self.dropping = true
        self.closeAfterReply = true
        self.dispatch(head, body: ByteBuffer(), tooLarge: true, context: context)
    }

    private func dispatch(_ head: HTTPRequestHead, body: ByteBuffer, tooLarge: Bool, context: ChannelHandlerContext) {
        self.answering = true
        if !head.isKeepAlive { self.closeAfterReply = true }
        let keepAliveHeader = head.version.major == 1 && head.version.minor == 0 && head.isKeepAlive
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        self.dispatcher.respond(to: head, body: body, bodyTooLarge: tooLarge, on: context.eventLoop) { reply, requestID in
            bound.value.write(reply, requestID: requestID, keepAliveHeader: keepAliveHeader)
        }
    }

    func read(context: ChannelHandlerContext) {
        if self.held.count >= Self.maxHeldParts {
            self.readPending = true
        } else {
            context.read()
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case let event as ChannelEvent where event == .inputClosed:
            // The client closed its side: answer what it sent, then close.
            if self.answering || !self.held.isEmpty {
                self.heldInputClosed = true
            } else {
                context.close(promise: nil)
            }
        case is ChannelShouldQuiesceEvent:
            // Graceful shutdown: close when nothing is pending, else once the pending replies are written.
            self.quiescing = true
            if !self.answering, self.held.isEmpty, self.reading == nil { context.close(promise: nil) }
        default:
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if self.answering || !self.held.isEmpty {
            if self.heldError == nil { self.heldError = error }
            return
        }
        self.fail(error, context: context)
    }

    /// A request that cannot be parsed gets a 400 and the connection is closed (what follows cannot be framed);
    /// a broken connection is just closed.
    private func fail(_ error: any Error, context: ChannelHandlerContext) {
        guard context.channel.isActive else { return }
        if error is IOError {
            context.close(promise: nil)
            return
        }
        let reply = Reply.error(AppError.badRequest("malformed HTTP request"))
        let buffer = Self.serialize(
            reply, requestID: APIDispatcher.newRequestID(), close: true, keepAliveHeader: false,
            allocator: context.channel.allocator)
        context.writeAndFlush(self.wrapOutboundOut(buffer)).assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }

    // MARK: Writing

    private func write(_ reply: Reply, requestID: String, keepAliveHeader: Bool) {
        self.answering = false
        guard let context = self.context, context.channel.isActive else { return }
        let close = self.closeAfterReply || (self.quiescing && self.held.isEmpty)
        let buffer = Self.serialize(
            reply, requestID: requestID, close: close, keepAliveHeader: keepAliveHeader && !close,
            allocator: context.channel.allocator)
        if close {
            self.disarm()
            context.writeAndFlush(self.wrapOutboundOut(buffer)).assumeIsolated().whenComplete { _ in
                context.close(promise: nil)
            }
            return
        }
        context.writeAndFlush(self.wrapOutboundOut(buffer), promise: nil)
        self.resume(context: context)
        if !self.answering, self.reading == nil { self.arm(context, self.idleTimeout) }  // waiting for the next request
    }

    /// Goes on with held parts once the reply before them is written; then lets reading continue. Re-entered
    /// when a held request is answered at once (a 401): the outer call carries on.
    private func resume(context: ChannelHandlerContext) {
        guard !self.resuming else { return }
        self.resuming = true
        defer { self.resuming = false }
        while !self.answering, context.channel.isActive, let part = self.held.popFirst() {
            self.process(part, context: context)
        }
        if self.readPending, self.held.count < Self.maxHeldParts {
            self.readPending = false
            context.read()
        }
        guard !self.answering, self.held.isEmpty, context.channel.isActive else { return }
        if let error = self.heldError {
            self.heldError = nil
            self.fail(error, context: context)
        } else if self.heldInputClosed || (self.quiescing && self.reading == nil) {
            self.heldInputClosed = false
            context.close(promise: nil)
        }
    }

    /// The status line, headers and body of a reply in one buffer: `Content-Type` (JSON unless the reply names
    /// another), `Content-Length`, `X-Request-Id`, `Date`, `Connection` when the connection closes (or an HTTP/1.0
    /// client asked to keep it), then the reply's own headers.
    static func serialize(
        _ reply: Reply, requestID: String, close: Bool, keepAliveHeader: Bool, allocator: ByteBufferAllocator
    ) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: 256 + reply.body.readableBytes)
        buffer.writeStaticString("HTTP/1.1 ")
        buffer.writeString(String(reply.status.code))
        buffer.writeStaticString(" ")
        buffer.writeString(reply.status.reasonPhrase)
        buffer.writeStaticString("\r\nContent-Type: ")
        if let type = reply.headers[.contentType] {
            buffer.writeString(type)
        } else {
            buffer.writeStaticString("application/json")
        }
        buffer.writeStaticString("\r\nContent-Length: ")
        buffer.writeString(String(reply.body.readableBytes))
        buffer.writeStaticString("\r\nX-Request-Id: ")
        buffer.writeString(requestID)
        buffer.writeStaticString("\r\nDate: ")
        buffer.writeString(HTTPDate.now())
        if close {
            buffer.writeStaticString("\r\nConnection: close")
        } else if keepAliveHeader {
            buffer.writeStaticString("\r\nConnection: keep-alive")
        }
        for field in reply.headers where field.name != .contentType {
            buffer.writeStaticString("\r\n")
            buffer.writeString(field.name.canonicalName)
            buffer.writeStaticString(": ")
            buffer.writeString(field.value)
        }
        buffer.writeStaticString("\r\n\r\n")
        var body = reply.body
        buffer.writeBuffer(&body)
        return buffer
    }

    // MARK: Deadlines

    private func arm(_ context: ChannelHandlerContext, _ timeout: TimeAmount) {
        let now = NIODeadline.now()
        self.deadline = now + timeout
        if self.timer == nil { self.schedule(context, now: now) }
    }

    /// The timer fires at the deadline or after the shorter timeout, whichever comes first. Every deadline is at
    /// least the shorter timeout away when it is set, so the timer is never late for one and a request never
    /// has to move it: one scheduled task per connection per `min(requestTimeout, idleTimeout)`, not two per
    /// request.
    private func schedule(_ context: ChannelHandlerContext, now: NIODeadline) {
        guard let deadline = self.deadline else { return }  // working on a request: no deadline until it is answered
        let shorter = self.requestTimeout < self.idleTimeout ? self.requestTimeout : self.idleTimeout
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        self.timer = context.eventLoop.scheduleTask(deadline: min(deadline, now + shorter)) {
            let (handler, context) = bound.value
            handler.timer = nil
            let now = NIODeadline.now()
            if let deadline = handler.deadline, deadline <= now {
                context.close(promise: nil)
            } else {
                handler.schedule(context, now: now)
            }
        }
    }

    private func disarm() {
        self.timer?.cancel()
        self.timer = nil
        self.deadline = nil
    }
}
