import NIOCore
import NIOPosix
import NIOSSL

/// One `GET` to a listener over TLS, for `check-config`: whether the program that holds a port is a metricsd
/// that speaks TLS there (a plain request to a TLS listener gets no answer, and a TLS one to a plain listener
/// none either).
///
/// The server's certificate is not verified: the probe only asks whether metricsd answers, sends nothing secret,
/// and must also recognise a daemon whose certificate does not name the address it is asked on (a wildcard
/// certificate, `127.0.0.1`) or has expired.
package enum TLSProbe {
    /// The raw response (head and body) to `GET path` on `host:port`, or nil when there is none within `timeout`
    /// (refused, no TLS, no answer).
    package static func get(host: String, port: Int, path: String, timeout: TimeAmount) async -> String? {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.certificateVerification = .none
        configuration.applicationProtocols = ["http/1.1"]
        guard let context = try? NIOSSLContext(configuration: configuration) else { return nil }
        let group = MultiThreadedEventLoopGroup.singleton
        let received = group.next().makePromise(of: ByteBuffer.self)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(timeout)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        NIOSSLClientHandler(context: context, serverHostname: nil))
                    try channel.pipeline.syncOperations.addHandler(ResponseCollector(received))
                }
            }
        guard let channel = try? await bootstrap.connect(host: host, port: port).get() else {
            received.fail(ChannelError.connectTimeout(timeout))
            return nil
        }
        let request =
            "GET \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\nUser-Agent: metricsd-check-config\r\n\r\n"
        channel.writeAndFlush(ByteBuffer(string: request), promise: nil)
        let deadline = channel.eventLoop.scheduleTask(in: timeout) { channel.close(promise: nil) }
        defer { deadline.cancel() }
        guard var buffer = try? await received.futureResult.get(), buffer.readableBytes > 0 else { return nil }
        return buffer.readString(length: buffer.readableBytes)
    }

    /// Collects what the server sends until the connection ends, then fulfils the promise with it.
    private final class ResponseCollector: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer

        private let promise: EventLoopPromise<ByteBuffer>
        private var buffer = ByteBuffer()

        init(_ promise: EventLoopPromise<ByteBuffer>) {
            self.promise = promise
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var part = self.unwrapInboundIn(data)
            // A health answer is a few hundred bytes: more is not metricsd's, and is not kept.
            if self.buffer.readableBytes < 64 * 1024 { self.buffer.writeBuffer(&part) }
        }

        func channelInactive(context: ChannelHandlerContext) {
            self.promise.succeed(self.buffer)
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            // A failed handshake (the listener speaks plain HTTP) or a close without close_notify: what arrived
            // is the answer.
            context.close(promise: nil)
        }
    }
}
