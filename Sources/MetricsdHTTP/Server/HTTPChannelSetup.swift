import Logging
import NIOCore
import NIOHTTP1
import NIOSSL

/// The HTTP/1.1 server of the API for one listener (see ``HTTPServer``).
///
/// NIO's HTTP/1 server pipeline (`configureHTTPServerPipeline`: decoder, encoder, pipelining order, half-close, HEAD
/// framing, parse errors), ``DrainGate`` for a polite stop, and ``HTTPConnectionHandler``, which hands every
/// request to the one ``APIDispatcher`` and writes the replies with back-pressure and a deadline in every state.
///
/// - Parameters:
///   - endpoints: what the server answers.
///   - credentials: the token checks of `.user` and `.admin` endpoints (replaced on reload).
///   - inFlight: requests in flight, shared by every listener of the process; beyond `maxInFlight` a request
///     gets an immediate 503.
///   - proxies: peers whose forwarded client address the request log shows.
///   - tls: the certificate, when the listener speaks TLS.
///   - sockets: the listener's sockets (several for a dual-stack socket unit), served alike.
///   - connectionLimit: connections beyond its maximum are accepted, answered 503 and closed at once (a client
///     learns at once; nothing waits in a queue), and logged.
///   - onServerRunning: called once every socket accepts, with their channels (for the bound addresses).
package func buildHTTPServer(
    endpoints: [Endpoint], credentials: CredentialBox, inFlight: InFlightCounter, maxInFlight: Int,
    requestLog: RequestLog, sockets: [ListenerSocket], timeouts: HTTPTimeouts,
    proxies: TrustedProxies = TrustedProxies(),
    tls: TLSIdentity? = nil, connectionLimit: ConnectionLimit.Settings? = nil,
    onServerRunning: (@Sendable ([any Channel]) async -> Void)? = nil, logger: Logger
) -> HTTPServer {
    let dispatcher = APIDispatcher(
        endpoints: endpoints, credentials: credentials, inFlight: inFlight, maxInFlight: maxInFlight,
        requestLog: requestLog, logger: logger)
    let setup = HTTPChannelSetup(
        dispatcher: dispatcher, timeouts: timeouts, proxies: proxies, tls: tls,
        connections: connectionLimit.map { ConnectionLimit($0, logger: logger) })
    return HTTPServer(sockets: sockets, setup: setup, onRunning: onServerRunning, logger: logger)
}

/// One HTTP/1.1 connection's pipeline and task.
package struct HTTPChannelSetup: Sendable {
    /// A connection: its channel, and the worker its task runs.
    package struct Connection: Sendable {
        let channel: any Channel
        let worker: ConnectionWorker
    }

    let dispatcher: APIDispatcher
    let timeouts: HTTPTimeouts
    let proxies: TrustedProxies
    /// The listener's certificate when it speaks TLS.
    let tls: TLSIdentity?
    let connections: ConnectionLimit?

    /// Header limits: a field and all fields at most 80 KiB each, at most 1,000 fields (HummingbirdCore's
    /// defaults).
    private static let decoderLimits: NIOHTTPDecoderLimitConfiguration = {
        var limits = NIOHTTPDecoderLimitConfiguration()
        limits.maxHeaderFieldSize = 80 * 1024
        limits.maxHeaderListSize = 80 * 1024
        limits.maxHeaderFieldCount = 1000
        return limits
    }()

    /// The pipeline of an accepted connection (before it is registered with its event loop).
    func configure(_ channel: any Channel) -> EventLoopFuture<Connection> {
        channel.eventLoop.makeCompletedFuture {
            let worker = ConnectionWorker()
            if let connections = self.connections, !connections.admit(channel) {
                worker.finish()
                // Over TLS a plain reply would be noise, and a handshake is work an overloaded server should not
                // take on: the connection is closed at once.
                try channel.pipeline.syncOperations.addHandler(
                    ConnectionRefusal(deadline: self.timeouts.write, reply: self.tls == nil, limit: connections))
                return Connection(channel: channel, worker: worker)
            }
            if let tls = self.tls {
                try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls.current))
            }
            // One read takes at most `readLimit` bytes: what a pipelining client can make the server parse and
            // hold while a reply is pending (NIO's pipeline handler stops reading until it has ended).
            let options = channel.syncOptions
            try options?.setOption(
                ChannelOptions.recvAllocator,
                value: AdaptiveRecvByteBufferAllocator(
                    minimum: 64, initial: 2048, maximum: HTTPConnectionHandler.readLimit))
            try options?.setOption(ChannelOptions.maxMessagesPerRead, value: 1)
            let pipeline = channel.pipeline.syncOperations
            try pipeline.configureHTTPServerPipeline(
                withPipeliningAssistance: true, withErrorHandling: false, withEncoderConfiguration: .init(),
                withDecoderLimitConfiguration: Self.decoderLimits)
            // Between the decoder and NIO's pipeline handler, which would close an idle connection at once.
            let pipelineHandler = try pipeline.handler(type: HTTPServerPipelineHandler.self)
            try pipeline.addHandler(DrainGate(), position: .before(pipelineHandler))
            try pipeline.addHandler(
                HTTPConnectionHandler(
                    dispatcher: self.dispatcher, worker: worker, timeouts: self.timeouts, proxies: self.proxies,
                    scheme: self.tls == nil ? "http" : "https", now: channel.eventLoop.now))
            return Connection(channel: channel, worker: worker)
        }
    }

    /// The connection's task: runs its worker's jobs until the connection closes; cancelled (the shutdown's grace
    /// period is over), it closes the connection.
    func handle(_ connection: Connection) async {
        let channel = connection.channel
        await withTaskCancellationHandler {
            await connection.worker.run()
        } onCancel: {
            channel.close(promise: nil)
        }
    }
}
