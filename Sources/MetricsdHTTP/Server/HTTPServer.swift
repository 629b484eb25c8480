import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix

/// The HTTP/1.1 server of the API: the daemon serves it, and so do the HTTP test suites.
///
/// HummingbirdCore's server (bootstrap, connection limit, graceful quiescing as a `Service`), NIO's HTTP/1
/// request decoder, and `HTTPConnectionHandler`, which hands every request to the one ``APIDispatcher`` and writes
/// the replies (keep-alive, deadlines for slow clients, closing on shutdown).
///
/// - Parameters:
///   - endpoints: what the server answers.
///   - credentials: the token checks of `.user` and `.admin` endpoints (replaced on reload).
///   - inFlight: requests in flight, shared by every listener of the process; beyond `maxInFlight` a request
///     gets an immediate 503.
///   - onServerRunning: called once the listener is bound, with its channel (for the bound address).
package func buildHTTPServer(
    endpoints: [Endpoint], credentials: CredentialBox, inFlight: InFlightCounter, maxInFlight: Int,
    requestLog: RequestLog, address: ListenAddress, requestTimeout: TimeAmount, idleTimeout: TimeAmount,
    maxConnections: Int? = nil, onServerRunning: (@Sendable (any Channel) async -> Void)? = nil, logger: Logger
) -> Server<MetricsdHTTPChannel> {
    let dispatcher = APIDispatcher(
        endpoints: endpoints, credentials: credentials, inFlight: inFlight, maxInFlight: maxInFlight,
        requestLog: requestLog, logger: logger)
    let channel = MetricsdHTTPChannel(dispatcher: dispatcher, requestTimeout: requestTimeout, idleTimeout: idleTimeout)
    let configuration = ServerConfiguration(
        address: .hostname(address.host, port: address.port), serverName: nil, reuseAddress: true,
        availableConnectionsDelegate: maxConnections.map { MaximumConnections($0) })
    return Server(
        childChannelSetup: channel, configuration: configuration, onServerRunning: onServerRunning,
        eventLoopGroup: MultiThreadedEventLoopGroup.singleton, logger: logger)
}

/// One HTTP/1.1 connection's pipeline (see ``buildHTTPServer``).
package struct MetricsdHTTPChannel: ServerChildChannel {
    /// A connection whose requests are answered by its handlers.
    package struct Connection: ServerChildChannelValue {
        package let channel: any Channel
    }

    let dispatcher: APIDispatcher
    let requestTimeout: TimeAmount
    let idleTimeout: TimeAmount

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
            let pipeline = channel.pipeline.syncOperations
            try pipeline.addHandler(ByteToMessageHandler(HTTPRequestDecoder(limitConfiguration: Self.decoderLimits)))
            try pipeline.addHandler(
                HTTPConnectionHandler(
                    dispatcher: self.dispatcher, requestTimeout: self.requestTimeout, idleTimeout: self.idleTimeout))
            return Connection(channel: channel)
        }
    }

    /// The connection is served by its handlers on its event loop; this task only waits for it to close (and
    /// closes it when the server's task is cancelled).
    package func handle(value: Connection, logger: Logger) async {
        let channel = value.channel
        await withTaskCancellationHandler {
            try? await channel.closeFuture.get()
        } onCancel: {
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
