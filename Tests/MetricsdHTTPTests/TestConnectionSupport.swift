import Foundation
import NIOCore
import Synchronization

@testable import MetricsdHTTP

/// What the test endpoints of ``TestConnection`` share with the test.
final class EndpointsState: Sendable {
    /// `/later` requests waiting for ``TestConnection/answer(_:)``.
    let pending = Mutex<[@Sendable (Endpoint.Answer) -> Void]>([])
    /// Calls of `/count`.
    let counted = Mutex(0)
}

/// The first handler of the pipeline: counts the reads that reach the socket, and drops what is written after
/// the close as a socket would (an `EmbeddedChannel` keeps collecting writes after it is closed).
final class ReadCounter: ChannelOutboundHandler, @unchecked Sendable {  // used on the channel's event loop only
    typealias OutboundIn = NIOAny
    private(set) var reads = 0

    func read(context: ChannelHandlerContext) {
        self.reads += 1
        context.read()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard context.channel.isActive else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.write(data, promise: promise)
    }
}
