import Foundation
import Glibc
import Synchronization
import Testing

/// A TCP relay on `127.0.0.1` in front of a server, that can stop relaying one connection while it keeps it open
/// and keeps relaying the others and new ones: that client sees a connection that accepts data and never answers
/// (a frozen server behind a live TCP stack, or a middlebox that lost the connection's state), and nothing else
/// changes. A thread per connection; for tests only. Always ``close()`` it (``withFreezingProxy(to:_:)`` does).
package final class FreezingProxy: Sendable {
    package let port: Int
    private let target: Int
    private let listener: Int32
    private let state = Mutex(State())

    private struct State {
        var connections: [Relay] = []
        var closed = false
    }

    /// One relayed connection: the client's socket and the server's.
    private final class Relay: Sendable {
        let client: Int32
        let server: Int32
        /// The local port of the connection to the server: the server sees it as the client's port
        /// (`pg_stat_activity.client_port`).
        let serverSidePort: Int
        let frozen = Atomic<Bool>(false)
        let closed = Atomic<Bool>(false)

        init(client: Int32, server: Int32) {
            self.client = client
            self.server = server
            var address = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(server, $0, &length) }
            }
            self.serverSidePort = Int(UInt16(bigEndian: address.sin_port))
        }
    }

    /// Listens on a free port and relays each connection to `127.0.0.1:target`.
    package init(target: Int) throws {
        self.target = target
        var port = 0
        var listener: Int32 = -1
        for _ in 0..<20 {
            port = DaemonProcess.freePort()
            listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
            var one: Int32 = 1
            _ = setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
            var address = Self.address(port: port)
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            if bound == 0 && listen(listener, 128) == 0 { break }
            Glibc.close(listener)
            listener = -1
        }
        try #require(listener >= 0, "the proxy found no free port")
        self.port = port
        self.listener = listener
        Thread.detachNewThread { self.acceptLoop() }
    }

    /// From now on the connection that reaches the server from `serverSidePort` (the server's
    /// `pg_stat_activity.client_port`) is neither read nor written; it stays open. False when there is none.
    package func freeze(serverSidePort: Int) -> Bool {
        let relay = self.state.withLock { state in
            state.connections.first { $0.serverSidePort == serverSidePort && !$0.closed.load(ordering: .relaxed) }
        }
        relay?.frozen.store(true, ordering: .relaxed)
        return relay != nil
    }

    /// Stops accepting and closes every connection.
    package func close() {
        let connections = self.state.withLock { state in
            state.closed = true
            defer { state.connections = [] }
            return state.connections
        }
        shutdown(self.listener, Int32(SHUT_RDWR))
        for relay in connections { Self.end(relay) }
    }

    private func acceptLoop() {
        while true {
            var poller = pollfd(fd: self.listener, events: Int16(POLLIN), revents: 0)
            _ = poll(&poller, 1, 200)
            if self.state.withLock({ $0.closed }) { break }
            guard poller.revents != 0 else { continue }
            let client = accept(self.listener, nil, nil)
            guard client >= 0 else { continue }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
            var address = Self.address(port: self.target)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard connected == 0 else {
                Glibc.close(server)
                Glibc.close(client)
                continue
            }
            let relay = Relay(client: client, server: server)
            let kept = self.state.withLock { state in
                if state.closed { return false }
                state.connections.append(relay)
                return true
            }
            guard kept else {
                Self.end(relay)
                break
            }
            Thread.detachNewThread { Self.pump(relay) }
        }
        Glibc.close(self.listener)
    }

    /// Copies bytes both ways until either side ends; once frozen, only waits (nothing read, nothing written).
    private static func pump(_ relay: Relay) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while !relay.closed.load(ordering: .relaxed) {
            if relay.frozen.load(ordering: .relaxed) {
                usleep(50_000)
                continue
            }
            var pollers = [
                pollfd(fd: relay.client, events: Int16(POLLIN), revents: 0),
                pollfd(fd: relay.server, events: Int16(POLLIN), revents: 0),
            ]
            guard poll(&pollers, 2, 100) > 0 else { continue }
            if relay.frozen.load(ordering: .relaxed) { continue }
            for (index, poller) in pollers.enumerated() where poller.revents != 0 {
                let (from, to) = index == 0 ? (relay.client, relay.server) : (relay.server, relay.client)
                let count = read(from, &buffer, buffer.count)
                guard count > 0, Self.writeAll(to, buffer, count) else {
                    Self.end(relay)
                    return
                }
            }
        }
    }

    private static func writeAll(_ descriptor: Int32, _ buffer: [UInt8], _ count: Int) -> Bool {
        var written = 0
        while written < count {
            let result = buffer.withUnsafeBytes {
                send(descriptor, $0.baseAddress! + written, count - written, Int32(MSG_NOSIGNAL))
            }
            guard result > 0 else { return false }
            written += result
        }
        return true
    }

    private static func end(_ relay: Relay) {
        guard !relay.closed.exchange(true, ordering: .relaxed) else { return }
        shutdown(relay.client, Int32(SHUT_RDWR))
        shutdown(relay.server, Int32(SHUT_RDWR))
        // Closed after the pump has seen `closed` (it polls at most 100 ms at a time).
        Thread.detachNewThread {
            usleep(300_000)
            Glibc.close(relay.client)
            Glibc.close(relay.server)
        }
    }

    private static func address(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        return address
    }
}

/// Runs `body` with a ``FreezingProxy`` in front of `127.0.0.1:target`, closed afterwards whatever happens.
package func withFreezingProxy<T>(to target: Int, _ body: (FreezingProxy) async throws -> T) async throws -> T {
    try await withCleanup(try FreezingProxy(target: target), cleanup: { $0.close() }, body)
}
