import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes

/// The last handler of every HTTP/1.1 connection: reads each request (head, body up to 16 KiB, end), hands it to
/// the ``APIDispatcher``, and writes the reply.
///
/// Requests are answered one at a time, in the order they arrived: parts that arrive while a reply is pending
/// (pipelining), the end of input (a client that half-closed after its last request) and a parse error wait
/// until the replies before them are written. Reading goes on while one request is answered (stopping and
/// restarting it would cost two `epoll_ctl` calls per request); a client that sends more than a few requests
/// ahead is not read from until they are answered (`maxHeldParts`).
///
/// After a reply the connection is closed when the request said `Connection: close`, or when its body was over
/// the limit (the rest of it is never read). Idle timeouts and graceful shutdown are Hummingbird's
/// `HTTPConnectionStateHandler`, earlier in the pipeline; slow clients are `RequestDeadlineHandler`'s.
final class HTTPConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    /// Parts held before reading stops (a few pipelined requests).
    static let maxHeldParts = 16

    private let dispatcher: APIDispatcher
    /// The request being read: its head, its body so far, whether the body went over the limit.
    private var reading: HTTPRequest?
    private var body: ByteBuffer?
    /// The rest of the current request (a body over the limit) is dropped as it arrives.
    private var dropping = false
    /// A request was handed to the dispatcher and its reply is not written yet.
    private var answering = false
    /// Close the connection once the pending reply is written.
    private var closeAfterReply = false
    /// Parts (and the end of input, and a parse error) that wait for the pending reply.
    private var held = CircularBuffer<HTTPRequestPart>()
    private var heldInputClosed = false
    private var heldError: (any Error)?
    /// A `read()` held back while too many parts wait.
    private var readPending = false
    private var resuming = false
    /// This handler's context while it is in the pipeline (replies arrive later).
    private var context: ChannelHandlerContext?

    init(dispatcher: APIDispatcher) {
        self.dispatcher = dispatcher
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    // MARK: Reading

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = self.unwrapInboundIn(data)
        if self.answering || !self.held.isEmpty {
            self.held.append(part)
        } else {
            self.process(part, context: context)
        }
    }

    private func process(_ part: HTTPRequestPart, context: ChannelHandlerContext) {
        switch part {
        case .head(let head):
            self.reading = head
            self.body = nil
            self.dropping = false
            // A declared body over the limit is refused at once, before any of it is read.
            if let declared = head.headerFields[.contentLength].flatMap({ Int($0) }), declared > APIDispatcher.maxBodySize {
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

    private func dispatch(_ head: HTTPRequest, body: ByteBuffer, tooLarge: Bool, context: ChannelHandlerContext) {
        self.answering = true
        if let connection = head.headerFields[.connection], connection.lowercased().contains("close") {
            self.closeAfterReply = true
        }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        self.dispatcher.respond(to: head, body: body, bodyTooLarge: tooLarge, on: context.eventLoop) { response, body in
            bound.value.write(response, body)
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
        if let event = event as? ChannelEvent, event == .inputClosed {
            // The client closed its side: answer what it sent, then close.
            if self.answering || !self.held.isEmpty {
                self.heldInputClosed = true
            } else {
                context.close(promise: nil)
            }
            return
        }
        context.fireUserInboundEventTriggered(event)
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
        let reply = AppError.badRequest("malformed HTTP request")
        let body = ByteBuffer(string: reply.body)
        let fields: HTTPFields = [
            .contentType: "application/json", .contentLength: String(body.readableBytes), .connection: "close",
            .requestID: APIDispatcher.newRequestID(), .date: HTTPDate.now(),
        ]
        context.write(self.wrapOutboundOut(.head(HTTPResponse(status: .badRequest, headerFields: fields))), promise: nil)
        context.write(self.wrapOutboundOut(.body(body)), promise: nil)
        context.writeAndFlush(self.wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }

    // MARK: Writing

    private func write(_ response: HTTPResponse, _ body: ByteBuffer) {
        self.answering = false
        guard let context = self.context, context.channel.isActive else { return }
        var response = response
        if self.closeAfterReply { response.headerFields[.connection] = "close" }
        context.write(self.wrapOutboundOut(.head(response)), promise: nil)
        if body.readableBytes > 0 { context.write(self.wrapOutboundOut(.body(body)), promise: nil) }
        if self.closeAfterReply {
            context.writeAndFlush(self.wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
            return
        }
        context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        self.resume(context: context)
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
        } else if self.heldInputClosed {
            self.heldInputClosed = false
            context.close(promise: nil)
        }
    }
}
