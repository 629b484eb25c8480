import Logging
import NIOCore
import NIOExtras
import NIOPosix
import ServiceLifecycle

/// Where a listener's socket comes from.
package enum ListenerSocket: Sendable, CustomStringConvertible {
    /// The server binds it.
    case bind(ListenAddress)
    /// A listening socket handed over by systemd (socket activation), with its `FileDescriptorName=`.
    case inherited(descriptor: CInt, name: String)

    package var description: String {
        switch self {
        case .bind(let address): address.description
        case .inherited(let descriptor, let name): "socket \(name) (descriptor \(descriptor), from systemd)"
        }
    }
}

/// The HTTP/1.1 server of one listener, as a `Service`: the daemon runs one per listener, and so do the HTTP test
/// suites. A listener may have several sockets (a socket unit with an IPv4 and an IPv6 `ListenStream=`): one
/// server serves them all, with one connection limit.
///
/// NIO's `ServerBootstrap` binds the address, or takes a socket systemd already bound (socket activation,
/// `bind(_:)` with a descriptor, which HummingbirdCore's server cannot take); each accepted connection
/// gets the pipeline of ``HTTPChannelSetup`` and a task of its own. Graceful shutdown is NIO's
/// `ServerQuiescingHelper`, one per socket: it closes this process's listening socket (one systemd holds stays
/// open, and what queues in it waits for the next process), then tells every connection to finish
/// (``DrainGate``), and the server returns once the last one has closed.
package final class HTTPServer: Service, Sendable {
    private let sockets: [ListenerSocket]
    private let setup: HTTPChannelSetup
    private let onRunning: (@Sendable ([any Channel]) async -> Void)?
    private let logger: Logger
    private let quiescing: [ServerQuiescingHelper]

    /// - Parameter onRunning: called once every socket accepts, with their channels (for the bound addresses).
    package init(
        sockets: [ListenerSocket], setup: HTTPChannelSetup, onRunning: (@Sendable ([any Channel]) async -> Void)? = nil,
        logger: Logger
    ) {
        precondition(!sockets.isEmpty, "a listener has at least one socket")
        self.sockets = sockets
        self.setup = setup
        self.onRunning = onRunning
        self.logger = logger
        self.quiescing = sockets.map { _ in ServerQuiescingHelper(group: MultiThreadedEventLoopGroup.singleton) }
    }

    package func run() async throws {
        var servers: [NIOAsyncChannel<HTTPChannelSetup.Connection, Never>] = []
        do {
            for (socket, quiescing) in zip(self.sockets, self.quiescing) {
                servers.append(try await self.listen(socket, quiescing))
            }
        } catch {
            // One socket that cannot be used stops the listener: those already open are closed again.
            for server in servers { try? await server.channel.close() }
            throw error
        }
        let (setup, logger, bound) = (self.setup, self.logger, servers)
        await withGracefulShutdownHandler {
            await self.onRunning?(bound.map(\.channel))
            await withDiscardingTaskGroup { group in
                for server in bound {
                    group.addTask { await Self.accept(server, setup: setup, logger: logger) }
                }
            }
        } onGracefulShutdown: {
            self.initiateShutdown(promise: nil)
        }
    }

    /// Accepts connections on one socket until it closes, each in a task of its own.
    private static func accept(
        _ server: NIOAsyncChannel<HTTPChannelSetup.Connection, Never>, setup: HTTPChannelSetup, logger: Logger
    ) async {
        await withDiscardingTaskGroup { group in
            do {
                try await server.executeThenClose { inbound in
                    for try await connection in inbound {
                        group.addTask { await setup.handle(connection) }
                    }
                }
            } catch {
                logger.error("Listener failed", metadata: ["metricsd.error": "\(error)"])
            }
        }
    }

    /// Stops accepting, lets every connection finish, and returns once all have closed (the HTTP test suites call
    /// this; the daemon stops the server through its service group).
    package func shutdownGracefully() async throws {
        let promise = MultiThreadedEventLoopGroup.singleton.next().makePromise(of: Void.self)
        self.initiateShutdown(promise: promise)
        try await promise.futureResult.get()
    }

    /// Every socket's helper stops; `promise` is fulfilled once all of them are done.
    private func initiateShutdown(promise: EventLoopPromise<Void>?) {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let done = self.quiescing.map { quiescing in
            let each = loop.makePromise(of: Void.self)
            quiescing.initiateShutdown(promise: each)
            return each.futureResult
        }
        guard let promise else { return }
        EventLoopFuture.andAllSucceed(done, on: loop).cascade(to: promise)
    }

    /// The listen backlog of a socket the server binds (a socket from systemd has the unit's `Backlog=`): the
    /// kernel caps it at `net.core.somaxconn` (4096 on Debian 12). With HummingbirdCore's 256, which the server had
    /// before, a burst of connections beyond it overflowed the accept queue: the kernel dropped the handshake's
    /// last ACK, the client took itself for connected, and the server side sent its SYN-ACK again only after 1 s,
    /// 3 s, 7 s — so a connection over `METRICSD_MAX_CONNECTIONS` got its 503 seconds late, seen from outside as
    /// waiting in the backlog (1,100 connections opened at once against the limit of 1,024: 21 of the 76 over it
    /// answered within 3 s; with 4096, all 76 within 2 s. NIO's pacing of accepted connections to the accept
    /// loop's task, `serverBackPressureStrategy: nil`, made no difference there).
    static let backlog: Int32 = 4096

    private func listen(
        _ socket: ListenerSocket, _ quiescing: ServerQuiescingHelper
    ) async throws -> NIOAsyncChannel<HTTPChannelSetup.Connection, Never> {
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(ChannelOptions.backlog, value: Self.backlog)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(quiescing.makeServerChannelHandler(channel: channel))
                }
            }
            .childChannelOption(ChannelOptions.allowRemoteHalfClosure, value: true)
        let setup = self.setup
        let initializer: @Sendable (any Channel) -> EventLoopFuture<HTTPChannelSetup.Connection> = {
            setup.configure($0)
        }
        let server: NIOAsyncChannel<HTTPChannelSetup.Connection, Never>
        switch socket {
        case .bind(let address):
            if let path = address.unixPath {
                server = try await bootstrap.bind(
                    unixDomainSocketPath: path, cleanupExistingSocketFile: true,
                    childChannelInitializer: initializer)
            } else {
                server = try await bootstrap.serverChannelOption(ChannelOptions.socketOption(.so_reuseaddr), value: 1)
                    .bind(
                        host: address.host, port: address.port, childChannelInitializer: initializer)
            }
        case .inherited(let descriptor, _):
            server = try await bootstrap.bind(
                descriptor, childChannelInitializer: initializer)
        }
        self.logger.debug("Listening", metadata: ["metricsd.listen": "\(socket)"])
        return server
    }
}
