import CoreMetrics
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import ServiceLifecycle
import Synchronization

/// Finished sampled spans waiting for the exporter: bounded, so a collector that is slow or gone costs memory up
/// to `capacity` spans and never a request's time. A span that finds the queue full is dropped and counted.
final class SpanQueue: Sendable {
    private let spans: Mutex<[FinishedSpan]>
    private let capacity: Int
    private let dropped: Counter

    init(capacity: Int, dropped: Counter) {
        self.spans = Mutex([])
        self.capacity = capacity
        self.dropped = dropped
    }

    func add(_ span: FinishedSpan) {
        let added = self.spans.withLock { spans in
            guard spans.count < self.capacity else { return false }
            spans.append(span)
            return true
        }
        if !added { self.dropped.increment() }
    }

    /// Up to `limit` of the oldest spans, removed from the queue.
    func take(upTo limit: Int) -> [FinishedSpan] {
        self.spans.withLock { spans in
            let taken = Array(spans.prefix(limit))
            spans.removeFirst(taken.count)
            return taken
        }
    }

    var count: Int { self.spans.withLock { $0.count } }
}

/// Sends finished spans to an OTLP/HTTP receiver as JSON (`POST /v1/traces`, the protobuf JSON mapping), once a
/// second and on shutdown, in requests of at most ``batchSize`` spans. A service of the daemon's group: on graceful
/// shutdown it sends what is queued, then stops.
///
/// Its own small client instead of swift-otel's exporter: swift-otel's OTLP/HTTP exporter brings
/// async-http-client and swift-protobuf into every build of metricsd — the test command's and the release build
/// the Debian package makes from scratch — and a clean build of a package that depends on it took nearly twice as
/// long as one of only the packages metricsd already builds (the Operations article, "Tracing", has the
/// measurement), in a test command already close to its time budget. JSON over one NIO HTTP/1.1 connection per
/// export (TLS through swift-nio-ssl, which the listeners use anyway, for an `https://` endpoint) is all a
/// collector needs.
public final class SpanExporter: Service, Sendable {
    static let batchSize = 512
    /// A failed export is logged at most this often (with how many failed since the last line).
    static let failureLogInterval: Duration = .seconds(60)

    let settings: TracingSettings
    let queue: SpanQueue
    private let logger: Logger
    private let dropped: Counter
    private let failures = Mutex<(count: Int, lastLogged: ContinuousClock.Instant?)>((0, nil))
    /// An `https://` endpoint's TLS context, made once (it loads the trust roots): nil for `http://`. A context
    /// that cannot be made fails every export (logged and counted as any failed export), never the daemon.
    private let tls: Result<NIOSSLContext, any Error>?

    init(settings: TracingSettings, queue: SpanQueue, dropped: Counter, logger: Logger) {
        self.settings = settings
        self.queue = queue
        self.dropped = dropped
        self.logger = logger
        self.tls = settings.endpoint.usesTLS ? Result { try settings.makeTLSContext() } : nil
    }

    public func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(1)) }
            await self.exportQueued()
        }
        await self.exportQueued()
    }

    /// Sends everything queued now, in batches; a batch that fails is dropped (and counted), not retried: the
    /// next second brings more, and a collector that is gone must not make the queue grow.
    func exportQueued() async {
        while true {
            let spans = self.queue.take(upTo: Self.batchSize)
            if spans.isEmpty { return }
            do {
                try await self.post(OTLPJSON.request(spans, serviceName: self.settings.serviceName))
            } catch {
                self.dropped.increment(by: spans.count)
                self.recordFailure(error)
                return
            }
        }
    }

    private func recordFailure(_ error: any Error) {
        let now = ContinuousClock.now
        let report: Int? = self.failures.withLock { failures in
            failures.count += 1
            if let last = failures.lastLogged, last.duration(to: now) < Self.failureLogInterval { return nil }
            defer { failures = (0, now) }
            return failures.count
        }
        guard let report else { return }
        self.logger.warning(
            "Trace export failed; spans dropped",
            metadata: [
                "metricsd.trace.endpoint": "\(self.settings.endpoint)", "metricsd.error": "\(error)",
                "metricsd.trace.failed_exports": "\(report)",
            ])
    }

    /// One POST, answered 2xx within 10 s, or an error.
    private func post(_ body: ByteBuffer) async throws {
        let endpoint = self.settings.endpoint
        let tls = try self.tls?.get()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await Self.send(body, to: endpoint, tls: tls) }
            group.addTask {
                try await Task.sleep(for: .seconds(10))
                throw ExportError("no answer within 10 s")
            }
            try await group.next()
            group.cancelAll()
        }
    }

    private static func send(_ body: ByteBuffer, to endpoint: TracingSettings.Endpoint, tls: NIOSSLContext?)
        async throws
    {
        // SNI takes a host name only; an IP address is verified against the certificate's IP addresses without it.
        let serverName = (try? SocketAddress(ipAddress: endpoint.host, port: 0)) == nil ? endpoint.host : nil
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(5))
            .connect(host: endpoint.host, port: endpoint.port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(
                            NIOSSLClientHandler(context: tls, serverHostname: serverName))
                    }
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(
                        wrappingChannelSynchronously: channel)
                }
            }
        var headers = HTTPHeaders()
        headers.add(
            name: "Host",
            value: endpoint.host.contains(":")
                ? "[\(endpoint.host)]:\(endpoint.port)" : "\(endpoint.host):\(endpoint.port)")
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: String(body.readableBytes))
        headers.add(name: "Connection", value: "close")
        let head = HTTPRequestHead(version: .http1_1, method: .POST, uri: endpoint.path, headers: headers)
        let status: UInt = try await channel.executeThenClose { inbound, outbound in
            try await outbound.write(.head(head))
            try await outbound.write(.body(.byteBuffer(body)))
            try await outbound.write(.end(nil))
            var status: UInt?
            for try await part in inbound {
                switch part {
                case .head(let response): status = response.status.code
                case .body: break
                case .end: return status ?? 0
                }
            }
            throw ExportError("the receiver closed the connection before answering")
        }
        guard (200..<300).contains(status) else { throw ExportError("the receiver answered \(status)") }
    }

    struct ExportError: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }
}
