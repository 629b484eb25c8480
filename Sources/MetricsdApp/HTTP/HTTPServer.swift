import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOPosix

/// The HTTP/1.1 server of the API: the daemon serves it, and so do the HTTP test suites.
///
/// HummingbirdCore's server (bootstrap, connection limit, graceful quiescing as a `Service`) and its connection
/// state handler (keep-alive, idle timeout, closing after the reply in flight on shutdown), with two handlers of
/// ours: `RequestDeadlineHandler` (slow clients) and `HTTPConnectionHandler`, which hands every request to the
/// one ``APIDispatcher``.
///
/// - Parameters:
///   - endpoints: what the server answers (the API, or only `/metrics` for a separate metrics listener).
///   - onServerRunning: called once the listener is bound, with its channel (for the bound address).
public func buildHTTPServer(
    _ dependencies: HTTPDependencies, endpoints: HTTPEndpoints = .api, address: ListenAddress,
    requestTimeout: TimeAmount, idleTimeout: TimeAmount, maxConnections: Int? = nil,
    onServerRunning: (@Sendable (any Channel) async -> Void)? = nil, logger: Logger
) -> Server<MetricsdHTTPChannel> {
    let dispatcher = APIDispatcher(
        endpoints: endpoints.list(dependencies), credentials: dependencies.credentials, inFlight: dependencies.inFlight,
        maxInFlight: dependencies.maxInFlight, requestLog: dependencies.requestLog, logger: logger)
    let channel = MetricsdHTTPChannel(dispatcher: dispatcher, requestTimeout: requestTimeout, idleTimeout: idleTimeout)
    let configuration = ServerConfiguration(
        address: .hostname(address.host, port: address.port), serverName: nil, reuseAddress: true,
        availableConnectionsDelegate: maxConnections.map { MaximumConnections($0) })
    return Server(
        childChannelSetup: channel, configuration: configuration, onServerRunning: onServerRunning,
        eventLoopGroup: MultiThreadedEventLoopGroup.singleton, logger: logger)
}

/// One HTTP/1.1 connection's pipeline (see ``buildHTTPServer``).
public struct MetricsdHTTPChannel: ServerChildChannel {
    /// A connection whose requests are answered by its handlers.
    public struct Connection: ServerChildChannelValue {
        public let channel: any Channel
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

    public func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Connection> {
        channel.eventLoop.makeCompletedFuture {
            let pipeline = channel.pipeline.syncOperations
            try pipeline.configureHTTPServerPipeline(
                withPipeliningAssistance: false, withErrorHandling: false, withOutboundHeaderValidation: false,
                withEncoderConfiguration: .init(), withDecoderLimitConfiguration: Self.decoderLimits)
            try pipeline.addHandler(HTTP1ToHTTPServerCodec(secure: false))
            try pipeline.addHandler(RequestDeadlineHandler(requestTimeout: self.requestTimeout, idleTimeout: self.idleTimeout))
            try pipeline.addHandler(HTTPConnectionStateHandler(idleTimeout: Duration(self.idleTimeout), logger: logger))
            try pipeline.addHandler(HTTPConnectionHandler(dispatcher: self.dispatcher))
            return Connection(channel: channel)
        }
    }

    /// The connection is served by its handlers on its event loop; this task only waits for it to close (and
    /// closes it when the server's task is cancelled).
    public func handle(value: Connection, logger: Logger) async {
        let channel = value.channel
        await withTaskCancellationHandler {
            try? await channel.closeFuture.get()
        } onCancel: {
            channel.close(promise: nil)
        }
    }
}
