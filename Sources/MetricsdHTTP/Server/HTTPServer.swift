import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix

/// The HTTP/1.1 server of the API: the daemon serves it, and so do the HTTP test suites.
///
/// HummingbirdCore's server (bootstrap, graceful quiescing as a `Service`, a task per connection), NIO's HTTP/1
/// server pipeline (`configureHTTPServerPipeline`: decoder, encoder, pipelining order, half-close, HEAD framing,
/// parse errors), and ``HTTPConnectionHandler``, which hands every request to the one ``APIDispatcher`` and writes
/// the replies with back-pressure and a deadline in every state.
///
/// - Parameters:
///   - endpoints: what the server answers.
///   - credentials: the token checks of `.user` and `.admin` endpoints (replaced on reload).
///   - inFlight: requests in flight, shared by every listener of the process; beyond `maxInFlight` a request
///     gets an immediate 503.
///   - maxConnections: connections beyond it are accepted, answered 503 and closed at once (a client learns at
///     once; nothing waits in a queue).
///   - onServerRunning: called once the listener is bound, with its channel (for the bound address).
package func buildHTTPServer(
    endpoints: [Endpoint], credentials: CredentialBox, inFlight: InFlightCounter, maxInFlight: Int,
    requestLog: RequestLog, address: ListenAddress, timeouts: HTTPTimeouts,
    maxConnections: Int? = nil, onServerRunning: (@Sendable (any Channel) async -> Void)? = nil, logger: Logger
) -> Server<MetricsdHTTPChannel> {
    let dispatcher = APIDispatcher(
        endpoints: endpoints, credentials: credentials, inFlight: inFlight, maxInFlight: maxInFlight,
        requestLog: requestLog, logger: logger)
    let channel = MetricsdHTTPChannel(
        dispatcher: dispatcher, timeouts: timeouts, connections: maxConnections.map { ConnectionLimit($0) })
    let configuration = ServerConfiguration(
        address: .hostname(address.host, port: address.port), serverName: nil, reuseAddress: true)
    return Server(
        childChannelSetup: channel, configuration: configuration, onServerRunning: onServerRunning,
        eventLoopGroup: MultiThreadedEventLoopGroup.singleton, logger: logger)
}

/// One HTTP/1.1 connection's pipeline and task (see ``buildHTTPServer``).
package struct MetricsdHTTPChannel: ServerChildChannel {
    /// A connection: its channel, and the worker its task runs.
    package struct Connection: ServerChildChannelValue {
        package let channel: any Channel
        let worker: ConnectionWorker
    }

    let dispatcher: APIDispatcher
    let timeouts: HTTPTimeouts
    let connections: ConnectionLimit?

    /// Header limits of Hummingbird's default HTTP/1 configuration.
    private static let decoderLimits: NIOHTTPDecoderLimitConfiguration = {
        let decoder = HTTP1Channel.Configuration().httpDecoder
        var limits = NIOHTTPDecoderLimitConfiguration()
        limits.maxHeaderFieldSize = decoder.maxHeaderFieldSize
        limits.maxHeaderListSize = decoder.maxHeaderListSize
        limits.maxHeaderFieldCount = decoder.maxHeaderFieldCount
        return limits
    }()

    package func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Connection> {
        channel.eventLoop.makeCompletedFuture {
            let worker = ConnectionWorker()
            if let connections = self.connections, !connections.admit(channel) {
                worker.finish()
                try channel.pipeline.syncOperations.addHandler(ConnectionRefusal(deadline: self.timeouts.write))
                return Connection(channel: channel, worker: worker)
            }
            // One read takes at most `readLimit` bytes: what a pipelining client can make the server parse and
            // hold while a reply is pending (NIO's pipeline handler stops reading until it has ended).
            let options = channel.syncOptions
            try options?.setOption(
                ChannelOptions.recvAllocator,
                value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 2048, maximum: HTTPConnectionHandler.readLimit))
            try options?.setOption(ChannelOptions.maxMessagesPerRead, value: 1)
            let pipeline = channel.pipeline.syncOperations
            try pipeline.configureHTTPServerPipeline(
                withPipeliningAssistance: true, withErrorHandling: false, withEncoderConfiguration: .init(),
                withDecoderLimitConfiguration: Self.decoderLimits)
            try pipeline.addHandler(
                HTTPConnectionHandler(
                    dispatcher: self.dispatcher, worker: worker, timeouts: self.timeouts, now: channel.eventLoop.now))
            return Connection(channel: channel, worker: worker)
        }
    }

    /// The connection's task: runs its worker's jobs until the connection closes; cancelled (server torn down),
    /// it closes the connection.
    package func handle(value: Connection, logger: Logger) async {
        let channel = value.channel
        await withTaskCancellationHandler {
            await value.worker.run()
        } onCancel: {
            channel.close(promise: nil)
        }
    }
}
