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

    /// Counts `channel` until it closes; false when it is over the limit.
    func admit(_ channel: any Channel) -> Bool {
        let count = self.open.add(1, ordering: .relaxed).newValue
        channel.closeFuture.whenComplete { _ in self.open.subtract(1, ordering: .relaxed) }
        return count <= self.limit
    }
}

/// The whole pipeline of a connection over the limit: a `503` that says so, then close. Nothing is read.
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

    init(deadline: TimeAmount) {
        self.deadline = deadline
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { self.refuse(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        self.refuse(context)
        context.fireChannelActive()
    }

    func read(context: ChannelHandlerContext) {}

    private func refuse(_ context: ChannelHandlerContext) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: self.deadline) { bound.value.close(promise: nil) }
        context.writeAndFlush(self.wrapOutboundOut(Self.reply)).flatMap {
            bound.value.close(mode: .output)
        }.whenComplete { _ in
            bound.value.close(promise: nil)
        }
    }
}
