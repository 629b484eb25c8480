import NIOCore
import Synchronization

/// The open connections of one listener. Beyond the limit a connection is still accepted, so that it leaves the
/// kernel's queue at once, and answered by ``ConnectionRefusal``: nothing waits in a queue that grows.
final class ConnectionLimit: Sendable {
    let limit: Int
    private let open = Atomic<Int>(0)

    init(_ limit: Int) {
        self.limit = limit
    }

    /// Counts `channel` until it closes; false when it is over the limit (it is then not counted: the slot it
    /// would hold while the 503 is taken goes to the next client).
    func admit(_ channel: any Channel) -> Bool {
        let count = self.open.add(1, ordering: .relaxed).newValue
        guard count <= self.limit else {
            self.open.subtract(1, ordering: .relaxed)
            return false
        }
        channel.closeFuture.whenComplete { _ in self.open.subtract(1, ordering: .relaxed) }
        return true
    }
}

/// The whole pipeline of a connection over the limit: a `503` that says so (or, over TLS, nothing), then end of
/// output. What the client sent is read and dropped until it closes, for at most a second: closing a socket with
/// unread bytes would reset the connection, and the client could lose the 503 it was about to read.
final class ConnectionRefusal: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    static let reply: ByteBuffer = {
        let body = AppError.unavailable(.tooManyConnections, "server busy: too many connections, retry shortly").body + "\n"
        return ByteBuffer(
            string: "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
                + "Retry-After: 1\r\nConnection: close\r\n\r\n" + body)
    }()

    private let deadline: TimeAmount
    private let sendsReply: Bool
    private var refused = false

    /// - Parameters:
    ///   - deadline: the connection is closed after it (at most a second) whatever the client does.
    ///   - reply: whether to write the 503 (false over TLS: the connection just ends).
    init(deadline: TimeAmount, reply: Bool = true) {
        self.deadline = min(deadline, .seconds(1))
        self.sendsReply = reply
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { self.refuse(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        self.refuse(context)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { context.close(promise: nil) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    private func refuse(_ context: ChannelHandlerContext) {
        guard !self.refused else { return }
        self.refused = true
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: self.deadline) { bound.value.close(promise: nil) }
        guard self.sendsReply else {
            context.close(promise: nil)
            return
        }
        context.writeAndFlush(self.wrapOutboundOut(Self.reply)).flatMap {
            bound.value.close(mode: .output)
        }.whenFailure { _ in
            bound.value.close(promise: nil)
        }
    }
}
