import Foundation
import Glibc

/// Plain TCP sockets and hand-written HTTP/1.1, for tests that must know exactly when a connection exists and
/// whether a response arrived whole (a client library would hide resets and retries).
package enum RawHTTP {
    /// A response as read off the wire.
    package enum Outcome: Sendable, Equatable, CustomStringConvertible {
        /// Status line, headers and the whole body (by `Content-Length` or chunked encoding) arrived.
        case complete(status: Int, body: String)
        /// The connection ended (EOF, reset, timeout) before a whole response: what was read, and why it ended.
        case incomplete(received: String, reason: String)

        package var description: String {
            switch self {
            case .complete(let status, let body): "complete \(status) \(body.prefix(120).debugDescription)"
            case .incomplete(let received, let reason):
                "INCOMPLETE (\(reason)) after \(received.prefix(200).debugDescription)"
            }
        }

        package var status: Int? {
            if case .complete(let status, _) = self { return status }
            return nil
        }
    }

    /// A blocking TCP connection to `127.0.0.1:port`; nil when it fails (refused: nothing listens).
    package static func connect(port: Int) -> Int32? {
        try? self.connectedSocket(port: port).get()
    }

    /// A blocking TCP socket connected to `127.0.0.1:port`, or why there is none. `receiveBuffer` (bytes) is set
    /// before connecting, so the window the client advertises stays that small.
    package static func connectedSocket(port: Int, receiveBuffer: Int? = nil) -> Result<Int32, HostileSocketError> {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else {
            return .failure(HostileSocketError("socket(): \(String(cString: strerror(errno)))"))
        }
        if var size = receiveBuffer.map(Int32.init) {
            _ = setsockopt(descriptor, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard rc == 0 else {
            let reason = String(cString: strerror(errno))
            close(descriptor)
            return .failure(HostileSocketError("connect to 127.0.0.1:\(port): \(reason)"))
        }
        return .success(descriptor)
    }

    /// Whether a TCP connection to `127.0.0.1:port` can be made right now (closed again at once).
    package static func canConnect(port: Int) -> Bool {
        guard let descriptor = self.connect(port: port) else { return false }
        close(descriptor)
        return true
    }

    /// Writes all of `text`; false on error.
    package static func send(_ descriptor: Int32, _ text: String) -> Bool {
        let bytes = Array(text.utf8)
        var sent = 0
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBytes {
                Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return false }
            sent += count
        }
        return true
    }

    /// A keep-alive `GET` request.
    package static func get(_ path: String, port: Int, headers: [String: String] = [:]) -> String {
        var text = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: keep-alive\r\n"
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { text += "\(name): \(value)\r\n" }
        return text + "\r\n"
    }

    /// Reads one response from each descriptor (all at once, with `poll`), on a thread of its own; closes them.
    package static func readResponses(_ descriptors: [Int32], timeout: Duration) async -> [Outcome] {
        await withCheckedContinuation { (continuation: CheckedContinuation<[Outcome], Never>) in
            Thread.detachNewThread {
                continuation.resume(returning: self.readResponsesBlocking(descriptors, timeout: timeout))
            }
        }
    }

    private static func readResponsesBlocking(_ descriptors: [Int32], timeout: Duration) -> [Outcome] {
        var buffers = [[UInt8]](repeating: [], count: descriptors.count)
        var outcomes = [Outcome?](repeating: nil, count: descriptors.count)
        let deadline = ContinuousClock.now + timeout
        var chunk = [UInt8](repeating: 0, count: 65536)
        while outcomes.contains(where: { $0 == nil }) {
            let remaining = deadline - ContinuousClock.now
            if remaining <= .zero { break }
            let open = descriptors.indices.filter { outcomes[$0] == nil }
            var pollers = open.map { pollfd(fd: descriptors[$0], events: Int16(POLLIN), revents: 0) }
            let milliseconds = Int32(
                min(
                    1000,
                    max(
                        1,
                        remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000))
            )
            let ready = poll(&pollers, nfds_t(pollers.count), milliseconds)
            if ready <= 0 { continue }
            for (position, index) in open.enumerated() where pollers[position].revents != 0 {
                let count = chunk.withUnsafeMutableBytes { recv(descriptors[index], $0.baseAddress, $0.count, 0) }
                if count > 0 {
                    buffers[index] += chunk[0..<count]
                    if let response = self.parse(buffers[index]) { outcomes[index] = response }
                } else if count == 0 {
                    outcomes[index] = .incomplete(
                        received: String(decoding: buffers[index], as: UTF8.self), reason: "EOF")
                } else if errno != EINTR && errno != EAGAIN {
                    outcomes[index] = .incomplete(
                        received: String(decoding: buffers[index], as: UTF8.self),
                        reason: String(cString: strerror(errno)))
                }
            }
        }
        for descriptor in descriptors { close(descriptor) }
        return outcomes.enumerated().map { index, outcome in
            outcome ?? .incomplete(received: String(decoding: buffers[index], as: UTF8.self), reason: "timed out")
        }
    }

    /// The response in `bytes` once it is whole; nil while more is needed.
    package static func parse(_ bytes: [UInt8]) -> Outcome? {
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let end = bytes.indices.dropLast(3).first(where: { Array(bytes[$0..<$0 + 4]) == separator }) else {
            return nil
        }
        let head = String(decoding: bytes[..<end], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else {
            return .incomplete(received: head, reason: "malformed status line")
        }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                in: .whitespaces)
        }
        let body = Array(bytes[(end + 4)...])
        if let length = headers["content-length"].flatMap({ Int($0) }) {
            guard body.count >= length else { return nil }
            return .complete(status: status, body: String(decoding: body[..<length], as: UTF8.self))
        }
        if headers["transfer-encoding"]?.lowercased() == "chunked" {
            var decoded: [UInt8] = []
            var position = 0
            while true {
                guard
                    let lineEnd = body.indices.dropFirst(position).dropLast().first(where: {
                        body[$0] == 13 && body[$0 + 1] == 10
                    })
                else { return nil }
                let sizeText =
                    String(decoding: body[position..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
                guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16) else {
                    return .incomplete(received: String(decoding: bytes, as: UTF8.self), reason: "malformed chunk size")
                }
                let dataStart = lineEnd + 2
                guard body.count >= dataStart + size + 2 else { return nil }
                if size == 0 { return .complete(status: status, body: String(decoding: decoded, as: UTF8.self)) }
                decoded += body[dataStart..<dataStart + size]
                position = dataStart + size + 2
            }
        }
        return status == 204 || status == 304 ? .complete(status: status, body: "") : nil
    }

    /// The number of connections waiting in the kernel's accept queue of the listener on `127.0.0.1:port`
    /// (`rx_queue` of the `LISTEN` row in `/proc/net/tcp`), nil when nothing listens there.
    package static func acceptQueueLength(port: Int) -> Int? {
        guard let table = try? String(contentsOfFile: "/proc/net/tcp", encoding: .utf8) else { return nil }
        let local = "0100007F:" + String(format: "%04X", port)
        for line in table.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ")
            guard fields.count > 4, fields[1] == local, fields[3] == "0A" else { continue }
            let queues = fields[4].split(separator: ":")
            return queues.count == 2 ? Int(queues[1], radix: 16) : nil
        }
        return nil
    }
}
