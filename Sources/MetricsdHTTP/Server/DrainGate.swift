import NIOCore
import NIOHTTP1

/// Closes a keep-alive connection politely when the server stops (graceful shutdown, `systemctl restart`).
///
/// NIO's `HTTPServerPipelineHandler` answers the quiesce event of a graceful stop by closing an idle connection at
/// once. A client of a keep-alive connection may have a request on its way at that moment — a load generator or a
/// proxy's pooled connection always has — and a request that reaches a closed socket is reset: a failed request,
/// though the server only restarted. So this handler, between NIO's decoder and its pipeline handler, holds the
/// quiesce event of an idle connection back for up to ``grace``: a request that arrives meanwhile goes in first and
/// the quiesce event right after it, so that NIO's pipeline handler answers it with `Connection: close` and then
/// closes (the client reconnects, to the next process when systemd holds the listening socket). A connection that
/// stays silent is closed when the grace ends. A connection busy with a request gets the event at once (closed
/// after its reply, as before).
final class DrainGate: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// How long an idle connection may still send one last request once the server stops: a round trip across
    /// continents, and a busy client's pause before it writes. Only a connection that sends nothing waits it out.
    static let grace = TimeAmount.milliseconds(500)

    /// Requests whose reply has not ended yet (more than one when the client pipelines).
    private var open = 0
    private var held = false
    private var timer: Scheduled<Void>?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head = self.unwrapInboundIn(data) {
            self.open += 1
            context.fireChannelRead(data)
            if self.held { self.release(context) }
        } else {
            context.fireChannelRead(data)
        }
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = self.unwrapOutboundIn(data), self.open > 0 { self.open -= 1 }
        context.write(data, promise: promise)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ChannelShouldQuiesceEvent, !self.held else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        if self.open > 0 {
            context.fireUserInboundEventTriggered(event)
            return
        }
        self.held = true
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        self.timer = context.eventLoop.scheduleTask(in: Self.grace) {
            let (handler, context) = bound.value
            if handler.held { handler.release(context) }
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.timer?.cancel()
        self.timer = nil
    }

    private func release(_ context: ChannelHandlerContext) {
        self.held = false
        self.timer?.cancel()
        self.timer = nil
        context.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
    }
}
