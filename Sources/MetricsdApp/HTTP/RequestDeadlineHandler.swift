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
    /// When the connection is closed unless something happens first; nil while the server works on a request.
    private var deadline: NIODeadline?
    /// One timer at a time, not one per request: it fires at (or after) `deadline` and looks again then.
    private var timer: Scheduled<Void>?

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
        self.disarm()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.disarm()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head: self.arm(context, self.requestTimeout)  // the body must follow in time
        case .body: break
        case .end:
            self.deadline = nil  // the request is in; the server works on it
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
