import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1

/// The HTTP/1.1 server of the API: the daemon serves it, and so do the HTTP test suites.
///
/// Hummingbird's HTTP/1 pipeline (decoder limits, HTTP types codec, connection state with idle timeout and
/// graceful quiescing, async channel) with two handlers of ours: `RequestDeadlineHandler` (slow clients) before
/// the connection state, and `TodayFastPath` (the hot read, answered on the event loop) after it, so keep-alive,
/// idle timeouts and graceful shutdown see every request, hot or not.
public func buildHTTPServer(
    _ dependencies: HTTPDependencies, requestTimeout: TimeAmount, idleTimeout: TimeAmount, logger: Logger
) -> HTTPServerBuilder {
    let endpoint = TodayEndpoint(
        store: dependencies.store, credentials: dependencies.credentials, inFlight: dependencies.inFlight,
        maxInFlight: dependencies.maxInFlight, logger: logger)
    return HTTPServerBuilder { responder in
        MetricsdHTTPChannel(
            http1: HTTP1Channel(responder: responder), requestTimeout: requestTimeout, idleTimeout: idleTimeout,
            endpoint: endpoint)
    }
}

/// `HTTP1Channel` with our handlers in place (see `buildHTTPServer`); requests that reach the async channel are
/// handled by Hummingbird's own `HTTP1Channel`.
struct MetricsdHTTPChannel: ServerChildChannel {
    typealias Value = NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>

    let http1: HTTP1Channel
    let requestTimeout: TimeAmount
    let idleTimeout: TimeAmount
    let endpoint: TodayEndpoint

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        channel.eventLoop.makeCompletedFuture {
            let decoder = self.http1.configuration.httpDecoder
            var limits = NIOHTTPDecoderLimitConfiguration()
            limits.maxHeaderFieldSize = decoder.maxHeaderFieldSize
            limits.maxHeaderListSize = decoder.maxHeaderListSize
            limits.maxHeaderFieldCount = decoder.maxHeaderFieldCount
            let pipeline = channel.pipeline.syncOperations
            try pipeline.configureHTTPServerPipeline(
                withPipeliningAssistance: false, withErrorHandling: false, withOutboundHeaderValidation: false,
                withEncoderConfiguration: .init(), withDecoderLimitConfiguration: limits)
            try pipeline.addHandler(HTTP1ToHTTPServerCodec(secure: false))
            try pipeline.addHandler(RequestDeadlineHandler(requestTimeout: self.requestTimeout, idleTimeout: self.idleTimeout))
            try pipeline.addHandler(
                HTTPConnectionStateHandler(idleTimeout: Duration(self.idleTimeout), logger: logger))
            try pipeline.addHandler(TodayFastPath(endpoint: self.endpoint, eventLoop: channel.eventLoop))
            return try NIOAsyncChannel(
                wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
        }
    }

    func handle(value: Value, logger: Logger) async {
        await self.http1.handle(value: value, logger: logger)
    }
}
