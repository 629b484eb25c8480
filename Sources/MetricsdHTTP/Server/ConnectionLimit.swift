import Logging
import NIOCore
import Synchronization

/// The open connections of one listener. Beyond the limit a connection is still accepted, so that it leaves the
/// kernel's queue at once, and answered by ``ConnectionRefusal``: nothing waits in a queue that grows.
///
/// Refusals are logged as a warning naming the listener and the setting that sets its limit: the first at once,
/// then at most one line per ``logInterval`` with the number refused since the line before, so a flood of
/// connections does not become a flood of log lines.
package final class ConnectionLimit: Sendable {
    /// Which listener, its limit, and the setting that sets it (named in the log).
    package struct Settings: Sendable {
        package let listener: String
        package let maximum: Int
        package let setting: String

        package init(listener: String, maximum: Int, setting: String) {
            self.listener = listener
            self.maximum = maximum
            self.setting = setting
        }
    }

    static let logInterval: UInt64 = 10_000_000_000
    /// Refused connections that may linger at once (their 503 written, the client's bytes read until it closes, at
    /// most a second each). Beyond them a refused connection is closed as soon as its 503 is written: a flood of
    /// connections must never hold more descriptors than the budget counts (``ConnectionLimit/lingeringRefusals``
    /// per listener), as a process out of descriptors fails wherever it next needs one.
    package static let lingeringRefusals = 16

    let limit: Int
    private let settings: Settings
    private let logger: Logger
    private let open = Atomic<Int>(0)
    /// Refused since the last log line.
    private let refused = Atomic<Int>(0)
    /// When the last log line was written (`NIODeadline` uptime nanoseconds); 0 before the first.
    private let loggedAt = Atomic<UInt64>(0)
    /// Refused connections lingering now.
    private let lingering = Atomic<Int>(0)

    init(_ settings: Settings, logger: Logger) {
        self.limit = settings.maximum
        self.settings = settings
        self.logger = logger
    }

    /// Counts `channel` until it closes; false when it is over the limit (it is then not counted: the slot it
    /// would hold while the 503 is taken goes to the next client).
    func admit(_ channel: any Channel) -> Bool {
        let count = self.open.add(1, ordering: .relaxed).newValue
        guard count <= self.limit else {
            self.open.subtract(1, ordering: .relaxed)
            self.noteRefusal()
            return false
        }
        channel.closeFuture.whenComplete { _ in self.open.subtract(1, ordering: .relaxed) }
        return true
    }

    /// Takes one of the ``lingeringRefusals`` slots for a refused connection until it closes; false when all are taken.
    func lingers(_ channel: any Channel) -> Bool {
        guard self.lingering.add(1, ordering: .relaxed).newValue <= Self.lingeringRefusals else {
            self.lingering.subtract(1, ordering: .relaxed)
            return false
        }
        channel.closeFuture.whenComplete { _ in self.lingering.subtract(1, ordering: .relaxed) }
        return true
    }

    private func noteRefusal() {
        self.refused.add(1, ordering: .relaxed)
        let now = NIODeadline.now().uptimeNanoseconds
        let last = self.loggedAt.load(ordering: .relaxed)
        guard last == 0 || now &- last >= Self.logInterval,
            self.loggedAt.compareExchange(expected: last, desired: max(now, 1), ordering: .relaxed).exchanged
        else { return }
        let count = self.refused.exchange(0, ordering: .relaxed)
        self.logger.warning(
            "Too many connections: new ones are answered 503 and closed",
            metadata: [
                "metricsd.listener": "\(self.settings.listener)", "metricsd.connections.limit": "\(self.limit)",
                "metricsd.connections.refused": "\(count)", "metricsd.setting": "\(self.settings.setting)",
            ])
    }
}

/// The whole pipeline of a connection over the limit: a `503` that says so (or, over TLS, nothing), then end of
/// output. While fewer than ``ConnectionLimit/lingeringRefusals`` do so, what the client sent is read and dropped
/// until it closes, for at most a second: closing a socket with unread bytes would reset the connection, and the
/// client could lose the 503 it was about to read. Beyond them the connection is closed once the 503 is written (a
/// client that sent nothing yet still reads it; one whose bytes arrive first may get a reset instead).
final class ConnectionRefusal: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    static let reply: ByteBuffer = {
        let body =
            AppError.unavailable(.tooManyConnections, "server busy: too many connections, retry shortly").body + "\n"
        return ByteBuffer(
            string:
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
                + "Retry-After: 1\r\nConnection: close\r\n\r\n" + body)
    }()

    private let deadline: TimeAmount
    private let sendsReply: Bool
    private let limit: ConnectionLimit?
    private var refused = false

    /// - Parameters:
    ///   - deadline: the connection is closed after it (at most a second) whatever the client does.
    ///   - reply: whether to write the 503 (false over TLS: the connection just ends).
    ///   - limit: whose lingering slots it takes (nil: it always lingers).
    init(deadline: TimeAmount, reply: Bool = true, limit: ConnectionLimit? = nil) {
        self.deadline = min(deadline, .seconds(1))
        self.sendsReply = reply
        self.limit = limit
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
        guard self.sendsReply else {
            context.close(promise: nil)
            return
        }
        guard self.limit?.lingers(context.channel) ?? true else {
            context.writeAndFlush(self.wrapOutboundOut(Self.reply)).whenComplete { _ in bound.value.close(promise: nil)
            }
            return
        }
        context.eventLoop.scheduleTask(in: self.deadline) { bound.value.close(promise: nil) }
        context.writeAndFlush(self.wrapOutboundOut(Self.reply)).flatMap {
            bound.value.close(mode: .output)
        }.whenFailure { _ in
            bound.value.close(promise: nil)
        }
    }
}
