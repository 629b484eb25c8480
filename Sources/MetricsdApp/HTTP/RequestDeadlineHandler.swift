import HummingbirdCore
import NIOCore
import NIOHTTPTypes

/// Closes connections whose requests arrive too slowly (slowloris) or that sit idle.
///
/// Installed on every connection: the first request's head must be complete within `requestTimeout` of the
/// connection opening; a later request's head within `idleTimeout` of the previous response; and every body
/// within `requestTimeout` of its head. A connection that misses a deadline is closed.
final class RequestDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let requestTimeout: TimeAmount
    private let idleTimeout: TimeAmount
    private var deadline: Scheduled<Void>?

    init(requestTimeout: TimeAmount, idleTimeout: TimeAmount) {
        self.requestTimeout = requestTimeout
        self.idleTimeout = idleTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { self.arm(context, self.requestTimeout) }
    }

    func channelActive(context: ChannelHandlerContext) {
        self.arm(context, self.requestTimeout)
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.deadline?.cancel()
        self.deadline = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.deadline?.cancel()
        self.deadline = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head: self.arm(context, self.requestTimeout)  // the body must follow in time
        case .body: break
        case .end:
            self.deadline?.cancel()  // the request is in; the server works on it
            self.deadline = nil
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = self.unwrapOutboundIn(data) {
            self.arm(context, self.idleTimeout)  // waiting for the next request
        }
        context.write(data, promise: promise)
    }

    private func arm(_ context: ChannelHandlerContext, _ timeout: TimeAmount) {
        self.deadline?.cancel()
        let channel = context.channel
        self.deadline = context.eventLoop.scheduleTask(in: timeout) {
            channel.close(promise: nil)
        }
    }
}

/// Stops accepting new connections while `limit` are open (they wait in the listen backlog), so a connection
/// flood cannot exhaust file descriptors or memory.
struct MaximumConnections: AvailableConnectionsDelegate {
    let limit: Int
    private var open = 0

    init(_ limit: Int) {
        self.limit = limit
    }

    mutating func connectionOpened() { self.open += 1 }
    mutating func connectionClosed() { self.open -= 1 }
    func isAcceptingNewConnections() -> Bool { self.open < self.limit }
}
